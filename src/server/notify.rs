//! systemd's readiness protocol (`sd_notify`), spoken without a C
//! library: when the service manager starts the server with
//! `Type=notify`, it sets `NOTIFY_SOCKET` to a Unix datagram socket (a
//! path, or an abstract name written with a leading `@`), and the server
//! sends `READY=1` there once every listener serves, after recovery, and
//! `STOPPING=1` when a graceful shutdown begins. Without the variable
//! nothing is sent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd names its socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Sends `state` (lines of `KEY=VALUE`, e.g. `READY=1`) to the socket
/// `NOTIFY_SOCKET` names; `Ok(false)` when the variable is not set (not
/// started by a service manager that listens).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET) else {
        return Ok(false);
    };
    let socket = socket.into_encoded_bytes();
    if socket.is_empty() {
        return Ok(false);
    }
    let addr = address(&socket)?;
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// The address `NOTIFY_SOCKET` names: a path, or with a leading `@` an
/// abstract name (Linux).
fn address(socket: &[u8]) -> io::Result<SocketAddr> {
    match socket.split_first() {
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        _ => {
            use std::os::unix::ffi::OsStrExt;
            SocketAddr::from_pathname(std::path::Path::new(std::ffi::OsStr::from_bytes(socket)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_and_an_abstract_name_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let addr = address(path.as_os_str().as_encoded_bytes()).unwrap();
        UnixDatagram::unbound()
            .unwrap()
            .send_to_addr(b"READY=1", &addr)
            .unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("letterbox-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let abstract_addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&abstract_addr).unwrap();
        let addr = address(format!("@{name}").as_bytes()).unwrap();
        assert_eq!(addr.as_abstract_name(), Some(name.as_bytes()));
        UnixDatagram::unbound()
            .unwrap()
            .send_to_addr(b"STOPPING=1", &addr)
            .unwrap();
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
