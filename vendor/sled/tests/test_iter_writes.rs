//! Writes while an iterator is open, checked against a model.
//!
//! Added by Letterbox beside the crate's own tree model tests
//! (`test_tree.rs`), for the case the iterator patch (`src/iter.rs`, see
//! PATCHED.md) argues about: a forward step takes the next key from the
//! copy of the leaf it last read, so keys written to that leaf after the
//! copy are not seen until the iterator reaches a new leaf. That is the
//! contract sled's iterators had before the patch (a scan is not a
//! snapshot, and never sees changes made to a leaf after it copied it);
//! these tests hold the patched iterator to the same contract:
//!
//! 1. keys come in strictly increasing order from `next` and strictly
//!    decreasing from `next_back`, the two ends never crossing, all inside
//!    the scanned range (scans go forward, backward, or both at once);
//! 2. every key present from the iterator's creation until the end of the
//!    scan, and never written meanwhile, is returned with its value;
//! 3. every pair returned was the key's value at some moment between the
//!    iterator's creation and the step that returned it.
//!
//! Leaves hold at most 16 records here, so a few hundred keys make a tree
//! of many leaves, and the writes split and merge them under the scan.

use std::collections::{BTreeMap, HashMap};
use std::convert::TryInto;
use std::ops::Bound;

use rand::{rngs::StdRng, Rng, SeedableRng};

const KEYS: u16 = 600;
const TRIALS: usize = 300;

fn key(i: u16) -> [u8; 2] {
    i.to_be_bytes()
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    let len = rng.gen_range(0, 24);
    (0..len).map(|_| rng.gen::<u8>()).collect()
}

/// Every value (None: absent) a key had since the scan began.
struct Seen {
    model: BTreeMap<[u8; 2], Vec<u8>>,
    history: HashMap<[u8; 2], Vec<Option<Vec<u8>>>>,
}

impl Seen {
    fn start(model: &BTreeMap<[u8; 2], Vec<u8>>) -> Seen {
        Seen { model: model.clone(), history: HashMap::new() }
    }

    fn write(&mut self, k: [u8; 2], v: Option<Vec<u8>>) {
        let before = self.model.get(&k).cloned();
        self.history.entry(k).or_insert_with(|| vec![before]).push(v.clone());
        match v {
            Some(v) => self.model.insert(k, v),
            None => self.model.remove(&k),
        };
    }

    fn held(&self, k: &[u8; 2], v: &[u8]) -> bool {
        match self.history.get(k) {
            Some(values) => values.iter().any(|x| x.as_deref() == Some(v)),
            None => self.model.get(k).map(|x| x.as_slice()) == Some(v),
        }
    }
}

fn in_range(k: u16, lo: u16, hi: u16) -> bool {
    lo <= k && k < hi
}

fn one_trial(tree: &sled::Tree, model: &mut BTreeMap<[u8; 2], Vec<u8>>, rng: &mut StdRng) {
    let lo = rng.gen_range(0, KEYS);
    let hi = rng.gen_range(lo, KEYS + 1);
    // 0: forward, 1: backward, 2: from both ends at random.
    let mode = rng.gen_range(0, 3);
    let at_open = model.clone();
    let mut seen = Seen::start(model);
    let mut iter = tree.range(key(lo)..key(hi));
    let mut returned: Vec<([u8; 2], Vec<u8>)> = Vec::new();
    // The last key each end returned.
    let mut front: Option<u16> = None;
    let mut back: Option<u16> = None;
    loop {
        let reverse = match mode {
            0 => false,
            1 => true,
            _ => rng.gen_bool(0.5),
        };
        // Writes, mostly close to where the scan stands (in the leaf it
        // holds a copy of), some anywhere.
        let here = if reverse { back.unwrap_or(hi) } else { front.unwrap_or(lo) };
        for _ in 0..rng.gen_range(0, 6) {
            let k = if rng.gen_bool(0.7) {
                let near = i32::from(here) + rng.gen_range(-20, 21);
                near.clamp(0, i32::from(KEYS) - 1) as u16
            } else {
                rng.gen_range(0, KEYS)
            };
            let k = key(k);
            if rng.gen_bool(0.5) {
                let v = value(rng);
                tree.insert(k, v.clone()).expect("insert");
                seen.write(k, Some(v));
            } else {
                tree.remove(k).expect("remove");
                seen.write(k, None);
            }
        }
        let step = if reverse { iter.next_back() } else { iter.next() };
        let Some(item) = step else { break };
        let (k, v) = item.expect("iterator step");
        let k: [u8; 2] = k.as_ref().try_into().expect("two-byte key");
        let n = u16::from_be_bytes(k);
        assert!(in_range(n, lo, hi), "key {} outside {}..{}", n, lo, hi);
        if let Some(f) = front {
            assert!(n > f, "{} returned after {} by the front (mode {})", n, f, mode);
        }
        if let Some(b) = back {
            assert!(n < b, "{} returned after {} by the back (mode {})", n, b, mode);
        }
        if reverse {
            back = Some(n);
        } else {
            front = Some(n);
        }
        assert!(seen.held(&k, &v), "key {} returned with a value it never had during the scan", n);
        returned.push((k, v.to_vec()));
    }
    let returned_count = returned.len();
    let got: BTreeMap<[u8; 2], Vec<u8>> = returned.into_iter().collect();
    assert_eq!(got.len(), returned_count, "a key was returned twice (mode {})", mode);
    let range = (Bound::Included(key(lo)), Bound::Excluded(key(hi)));
    for (k, v) in at_open.range(range) {
        let untouched = !seen.history.contains_key(k);
        if untouched {
            assert_eq!(
                got.get(k),
                Some(v),
                "key {} present throughout the scan of {}..{} (mode {}) was not returned as it was",
                u16::from_be_bytes(*k),
                lo,
                hi,
                mode
            );
        }
    }
    *model = seen.model;
}

fn run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let db = sled::Config::new().temporary(true).open().expect("open");
    let tree = db.open_tree("t").expect("tree");
    let mut model = BTreeMap::new();
    for i in 0..KEYS {
        if rng.gen_bool(0.6) {
            let v = value(&mut rng);
            tree.insert(key(i), v.clone()).expect("insert");
            model.insert(key(i), v);
        }
    }
    for _ in 0..TRIALS {
        one_trial(&tree, &mut model, &mut rng);
    }
    let all: BTreeMap<[u8; 2], Vec<u8>> = tree
        .iter()
        .map(|r| {
            let (k, v) = r.expect("scan");
            (k.as_ref().try_into().expect("two-byte key"), v.to_vec())
        })
        .collect();
    assert_eq!(all, model, "the tree after seed {} differs from the model", seed);
}

#[test]
fn writes_while_iterating_match_the_model() {
    for seed in 0..8 {
        run(seed);
    }
}
