//! What a service manager and a health checker see: `READY=1` and
//! `STOPPING=1` on systemd's `NOTIFY_SOCKET` (the unit is `Type=notify`),
//! and `letterbox health`, the container's health check.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use letterbox::launch::Serve;

use crate::harness::*;

/// The next datagram on `sock`, as text.
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = sock
        .recv(&mut buf)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn ready_once_serving_and_stopping_at_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notify");
    let sock = UnixDatagram::bind(&socket).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut serve = Serve::new(env!("CARGO_BIN_EXE_letterbox"), &dir.path().join("data"));
    serve
        .command()
        .args(["--listen", "127.0.0.1:0", "--min-free-disk", "0"])
        .env("NOTIFY_SOCKET", &socket)
        .env("LETTERBOX_LOG", "info");
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut served = serve.spawn(log).unwrap();
    // Nothing before the server serves: the first datagram comes after
    // the address is announced, and a call made then is answered.
    let ready = next(&sock);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    served
        .wait_blocking(|a| a.grpc.is_some(), Duration::from_secs(10))
        .unwrap();
    let addr = served.announced.grpc.unwrap();
    let out = letterbox()
        .args(["health", "--server", &format!("http://{addr}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let pid = rustix::process::Pid::from_raw(i32::try_from(served.child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let stopping = next(&sock);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = served.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// A socket that is not there is logged, and the server serves anyway.
#[test]
fn a_missing_socket_does_not_stop_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _addr) = {
        let mut serve = Serve::new(env!("CARGO_BIN_EXE_letterbox"), &dir.path().join("data"));
        serve
            .command()
            .args(["--listen", "127.0.0.1:0", "--min-free-disk", "0"])
            .env("NOTIFY_SOCKET", dir.path().join("nobody-listens"))
            .env("LETTERBOX_LOG", "info");
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut served = serve.spawn(log).unwrap();
        served
            .wait_blocking(|a| a.grpc.is_some(), Duration::from_secs(60))
            .unwrap();
        let addr = served.announced.grpc.unwrap();
        (served.child, addr)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
        if log.contains("NOTIFY_SOCKET") || std::time::Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(log.contains("cannot notify the service manager"), "{log}");
    assert!(child.try_wait().unwrap().is_none(), "the server exited");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn health_says_serving_and_its_exit_code_follows() {
    let s = TestServer::start().await;
    let server = format!("http://{}", s.addr);
    let run = |args: &[&str]| {
        letterbox()
            .arg("health")
            .args(args)
            .args(["--server", &server])
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{server}: serving")
    );
    let out = run(&["--json"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"serving":true}"#
    );
    let out = run(&["--service", "letterbox.v1.MessagingService"]);
    assert_eq!(out.status.code(), Some(0));
    // A service the server does not have: an error naming it.
    let out = run(&["--service", "no.such.Service"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOT_FOUND"), "{err}");
    // Nobody there: exit 3, the address named.
    let out = letterbox()
        .args(["health", "--server", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"));
}
