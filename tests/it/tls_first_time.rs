//! TLS that works the first time: `letterbox tls init` makes what the
//! server and the CLI need; a CA certificate given as the server's own is
//! refused at start with the fix; the CLI says in words what is wrong with
//! a certificate; and the CLI pointed at a listener that is not gRPC says
//! which listener it reached and where gRPC is.

use std::path::Path;
use std::process::Output;

use crate::harness::*;

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// No Rust debug text: words only.
#[track_caller]
fn words_only(s: &str) {
    for debug in [
        "Some(",
        "Other(",
        "OtherError",
        "CaUsedAsEndEntity",
        "{ ",
        "Os {",
    ] {
        assert!(!s.contains(debug), "debug text {debug:?} in: {s}");
    }
}

fn path(dir: &Path, file: &str) -> String {
    dir.join(file).display().to_string()
}

#[tokio::test]
async fn tls_init_makes_what_the_server_and_the_cli_need() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("pki");
    let out = letterbox()
        .args(["tls", "init"])
        .arg(&dir)
        .args(["--client", "edge"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    // It says what each file is and the flags that use them.
    let serve_line = format!(
        "serve with:   letterbox serve --tls-cert {} --tls-key {} --tls-client-ca {}",
        path(&dir, "server.pem"),
        path(&dir, "server.key"),
        path(&dir, "ca.pem")
    );
    assert!(stdout.contains(&serve_line), "{stdout}");
    assert!(
        stdout.contains("the server's certificate, for localhost, 127.0.0.1, ::1"),
        "{stdout}"
    );
    assert!(stdout.contains("cert_sha256 = [\""), "{stdout}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |f: &str| std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("ca.key"), 0o600);
    assert_eq!(mode("server.key"), 0o600);
    assert_eq!(mode("client.key"), 0o600);
    assert_eq!(mode("server.pem"), 0o644);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // Again: nothing is replaced without --force.
    let before = std::fs::read(dir.join("server.pem")).unwrap();
    let again = letterbox()
        .args(["tls", "init"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again).1.contains("exists (give --force"),
        "{}",
        text(&again).1
    );
    assert_eq!(std::fs::read(dir.join("server.pem")).unwrap(), before);

    // The server takes the files as printed, client certificates required.
    let server = TestServer::start_with(&[
        "--tls-cert",
        &path(&dir, "server.pem"),
        "--tls-key",
        &path(&dir, "server.key"),
        "--tls-client-ca",
        &path(&dir, "ca.pem"),
        "--tls-require-client-cert",
    ])
    .await;
    // Its start line for gRPC says TLS is on and client certificates are
    // required.
    let log = server.log();
    let grpc_line = log
        .lines()
        .find(|l| l.contains("serving gRPC"))
        .expect("a start line for gRPC");
    assert!(grpc_line.contains("tls=on"), "{grpc_line}");
    assert!(grpc_line.contains("client_certs=required"), "{grpc_line}");
    let port = server.addr.port();
    for host in ["localhost", "127.0.0.1"] {
        let out = letterbox()
            .args([
                "queue",
                "list",
                "--server",
                &format!("https://{host}:{port}"),
            ])
            .args(["--ca-cert", &path(&dir, "ca.pem")])
            .args(["--client-cert", &path(&dir, "client.pem")])
            .args(["--client-key", &path(&dir, "client.key")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{host}: {}", text(&out).1);
    }
    // Without the client certificate: refused, in words.
    let out = letterbox()
        .args([
            "queue",
            "list",
            "--server",
            &format!("https://localhost:{port}"),
        ])
        .args(["--ca-cert", &path(&dir, "ca.pem")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let (_, stderr) = text(&out);
    assert!(stderr.contains("--client-cert"), "{stderr}");
    words_only(&stderr);
}

/// A CA certificate and its key, as `openssl req -x509` makes them.
fn ca_as_server(dir: &Path) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join("ca-as-server.pem"), dir.join("ca-as-server.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string())
}

#[test]
fn a_ca_certificate_is_refused_as_the_servers_own() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca_as_server(dir.path());
    let out = letterbox()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--tls-cert", &cert, "--tls-key", &key])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(&format!(
            "--tls-cert {cert}: it is a CA certificate (basic constraints CA:TRUE)"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("letterbox tls init DIR --name HOST"),
        "{stderr}"
    );
    assert!(!dir.path().join("data").exists(), "nothing was started");
}

/// A TLS listener that presents `cert` (whatever it is) and answers
/// nothing; the client's verdict on the certificate is all that matters.
async fn tls_listener(cert: &str, key: &str) -> std::net::SocketAddr {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_what_is_wrong_with_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca_as_server(dir.path());
    let addr = tls_listener(&cert, &key).await;
    let cli = |server: String, ca: &str| {
        let out = letterbox()
            .args(["queue", "list", "--server", &server, "--ca-cert", ca])
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        words_only(&stderr);
        (out.status.code(), stderr)
    };
    // The CA certificate as the server's own: trusted, yet refused, and
    // the message says why.
    let (code, stderr) = cli(format!("https://localhost:{}", addr.port()), &cert);
    assert_eq!(code, Some(3));
    assert!(
        stderr.contains("presents a CA certificate (basic constraints CA:TRUE) as its own"),
        "{stderr}"
    );
    assert!(stderr.contains("letterbox tls init"), "{stderr}");

    // A certificate for localhost reached as 127.0.0.1.
    let pki = dir.path().join("pki");
    let made = letterbox()
        .args(["tls", "init"])
        .arg(&pki)
        .args(["--name", "localhost"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made).1);
    let addr = tls_listener(&path(&pki, "server.pem"), &path(&pki, "server.key")).await;
    let (code, stderr) = cli(
        format!("https://127.0.0.1:{}", addr.port()),
        &path(&pki, "ca.pem"),
    );
    assert_eq!(code, Some(3));
    assert!(
        stderr.contains("it is not made out for \"127.0.0.1\" (it names localhost)"),
        "{stderr}"
    );
    // Signed by a CA the client was not given.
    let (code, stderr) = cli(format!("https://localhost:{}", addr.port()), &cert);
    assert_eq!(code, Some(3));
    assert!(
        stderr.contains("it is not signed by a CA the client trusts; give --ca-cert"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_cli_at_another_listener_says_which_and_where_grpc_is() {
    let server = InProc::start_with(|c| {
        c.anypoint_listen = Some("127.0.0.1:0".parse().unwrap());
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console_listen = Some(letterbox::server::ConsoleAt::Exactly(
            "127.0.0.1:0".parse().unwrap(),
        ));
    })
    .await;
    let grpc = format!("gRPC is at http://{}", server.addr);
    let listeners = [
        ("REST", server.anypoint.unwrap()),
        ("metrics", server.metrics.unwrap()),
        ("console", server.console.unwrap()),
    ];
    for (name, addr) in listeners {
        let out = tokio::task::spawn_blocking(move || {
            letterbox()
                .args(["queue", "list", "--server", &format!("http://{addr}")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "this is Letterbox's {name} listener (HTTP), not its gRPC one"
            )),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(&grpc), "{name}: {stderr}");
        assert!(!stderr.contains("compression flag"), "{stderr}");
    }
    // The HTTP listeners still serve what they serve.
    let (status, _) = crate::ecosystem::http_get(server.metrics.unwrap(), "/metrics").await;
    assert!(status.contains(" 200 "), "{status}");
}
