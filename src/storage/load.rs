//! What the engine's load at start reads: [`LoadSource`], the typed scan
//! of one key space and the system values, from either the local
//! database as the log's replay left it ([`Reader`](super::Reader),
//! overlapping the load with the local store's own scan) or any
//! [`Backend`], read in key order in pages of [`Backend::scan`]
//! ([`Paged`]).

use bytes::Bytes;

use super::backend::prefix_end;
use super::{Backend, Key, OwnedKey, Result, Space, StorageError, SysKey, records};

/// A store's state as the engine loads it at start.
pub trait LoadSource {
    /// The keys of one space in key order, with decoded values.
    fn scan<T: records::Record>(
        &self,
        space: Space,
    ) -> impl Iterator<Item = Result<(OwnedKey, T)>> + '_;

    /// A system value.
    fn get_sys(&self, key: SysKey) -> Result<Option<u64>>;
}

/// Entries read from a backend per [`Backend::scan`] when the engine loads.
pub const LOAD_PAGE: usize = 1024;

/// A [`Backend`] as a [`LoadSource`]: each space read in pages of at most
/// `page` entries ([`pages`]), never the whole space in one call.
#[derive(Debug)]
pub struct Paged<'a, B: Backend + ?Sized> {
    backend: &'a B,
    page: usize,
}

impl<'a, B: Backend + ?Sized> Paged<'a, B> {
    /// Reads `backend` in pages of `page` entries (at least one).
    pub fn new(backend: &'a B, page: usize) -> Paged<'a, B> {
        Paged {
            backend,
            page: page.max(1),
        }
    }
}

impl<B: Backend + ?Sized> LoadSource for Paged<'_, B> {
    fn scan<T: records::Record>(
        &self,
        space: Space,
    ) -> impl Iterator<Item = Result<(OwnedKey, T)>> + '_ {
        pages(self.backend, &space.prefix(), self.page).map(|item| {
            let (k, v) = item?;
            let key = OwnedKey::decode(&k)
                .ok_or_else(|| StorageError::corrupt(format!("key {k:?}"), "malformed key"))?;
            let value = records::decode(&records::Lazy(&key), &v)?;
            Ok((key, value))
        })
    }

    fn get_sys(&self, key: SysKey) -> Result<Option<u64>> {
        match self.backend.get(&Key::Sys(key).encode())? {
            None => Ok(None),
            Some(b) => Ok(Some(u64::from_be_bytes(b.as_ref().try_into().map_err(
                |_| StorageError::corrupt(format!("system key {key:?}"), "not 8 bytes"),
            )?))),
        }
    }
}

/// The entries whose keys start with `prefix`, in key order, read lazily
/// in pages of `page` entries (at least one): each page starts just after
/// the last key of the one before. A backend that answers a key not after
/// the one before it (a page repeating an entry) is an error.
pub fn pages<'a, B: Backend + ?Sized>(backend: &'a B, prefix: &[u8], page: usize) -> Pages<'a, B> {
    Pages {
        backend,
        start: prefix.to_vec(),
        end: prefix_end(prefix),
        page: page.max(1),
        buf: Vec::new().into_iter(),
        last: None,
        done: false,
    }
}

/// The iterator of [`pages`].
#[derive(Debug)]
pub struct Pages<'a, B: Backend + ?Sized> {
    backend: &'a B,
    /// Where the next page starts.
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    page: usize,
    /// What is left of the current page.
    buf: std::vec::IntoIter<(Bytes, Bytes)>,
    /// The last key returned.
    last: Option<Bytes>,
    /// The last page read was not full, or a scan failed.
    done: bool,
}

impl<B: Backend + ?Sized> Iterator for Pages<'_, B> {
    type Item = Result<(Bytes, Bytes)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.buf.next() {
                if self.last.as_ref().is_some_and(|last| k <= *last) {
                    self.done = true;
                    self.buf = Vec::new().into_iter();
                    return Some(Err(StorageError::corrupt(
                        format!("key {k:?}"),
                        "a scan returned a key not after the one before it",
                    )));
                }
                self.last = Some(k.clone());
                return Some(Ok((k, v)));
            }
            if self.done {
                return None;
            }
            match self
                .backend
                .scan(&self.start, self.end.as_deref(), self.page)
            {
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Ok(got) => {
                    self.done = got.len() < self.page;
                    if let Some((last, _)) = got.last() {
                        // The smallest key after `last`.
                        self.start.clear();
                        self.start.extend_from_slice(last);
                        self.start.push(0);
                    }
                    self.buf = got.into_iter();
                }
            }
        }
    }
}
