//! Principals, credentials, grants and the secret cache.

use super::*;

fn principal(name: &str) -> PrincipalConfig {
    PrincipalConfig {
        name: name.into(),
        token_sha256: vec![hex_sha256(format!("token-of-{name}").as_bytes())],
        ..PrincipalConfig::default()
    }
}

#[test]
fn patterns_match_like_globs() {
    let p = |t: &str| Pattern::parse(t).unwrap();
    assert!(p("*").matches(""));
    assert!(p("*").matches("orders"));
    assert!(p("orders.*").matches("orders.eu"));
    assert!(!p("orders.*").matches("orders"));
    assert!(p("o?ders").matches("orders"));
    assert!(p("*-dlq").matches("orders-dlq"));
    assert!(!p("*-dlq").matches("orders-dlq2"));
    assert!(p("a*b*c").matches("aXXbYYc"));
    assert!(!p("a*b*c").matches("aXXbYY"));
    assert!(p("exact").matches("exact"));
    assert!(!p("exact").matches("exactly"));
    assert!(Pattern::parse("").is_err());
}

#[test]
fn grants_are_per_action_and_name() {
    let mut c = principal("orders");
    c.publish = vec!["orders".into()];
    c.consume = vec!["orders".into(), "orders-*".into()];
    let a = Authenticator::new(&[c]).unwrap();
    let p = a
        .authenticate(Credentials::Bearer("token-of-orders"), None)
        .unwrap();
    assert_eq!(p.name(), "orders");
    assert!(p.allows(Action::Publish, "orders"));
    assert!(!p.allows(Action::Publish, "orders-dlq"));
    assert!(p.allows(Action::Consume, "orders-dlq"));
    assert!(!p.allows(Action::Admin, "orders"));
    assert!(p.sees("orders-dlq"));
    assert!(!p.sees("billing"));
    assert_eq!(
        p.check(Action::Admin, "orders"),
        Err(AuthError::PermissionDenied {
            principal: "orders".into(),
            action: "admin",
            name: "orders".into()
        })
    );
}

#[test]
fn disabled_means_anonymous_may_do_everything() {
    let a = Authenticator::new(&[]).unwrap();
    assert!(!a.is_enabled());
    let p = a.authenticate(Credentials::None, None).unwrap();
    assert!(p.allows(Action::Admin, "anything"));
    assert!(p.allows_all(Action::Admin));
}

#[test]
fn client_secrets_are_checked_against_their_hash() {
    let mut c = principal("app");
    c.client_id = Some("app-id".into());
    c.secret_hash = Some(hash_secret("s3cret").unwrap());
    let a = Authenticator::new(&[c]).unwrap();
    let ok = |secret| {
        a.authenticate(
            Credentials::ClientSecret {
                id: "app-id",
                secret,
            },
            None,
        )
    };
    assert_eq!(ok("s3cret").unwrap().name(), "app");
    // Second time from the cache.
    assert_eq!(ok("s3cret").unwrap().name(), "app");
    assert!(matches!(ok("wrong"), Err(AuthError::Unauthenticated(_))));
    assert!(matches!(
        a.authenticate(
            Credentials::ClientSecret {
                id: "other",
                secret: "s3cret"
            },
            None
        ),
        Err(AuthError::Unauthenticated(_))
    ));
    assert!(matches!(
        a.authenticate(Credentials::None, None),
        Err(AuthError::Unauthenticated(_))
    ));
    assert!(matches!(
        a.authenticate(Credentials::Bearer("nope"), None),
        Err(AuthError::Unauthenticated(_))
    ));
}

/// An authenticator with one client ("app-id", secret "s3cret") whose
/// cache reads the time from the returned offset (milliseconds).
fn with_client_and_time() -> (Arc<Authenticator>, Arc<AtomicU64>) {
    let mut c = principal("app");
    c.client_id = Some("app-id".into());
    c.secret_hash = Some(hash_secret("s3cret").unwrap());
    let mut a = Authenticator::new(&[c]).unwrap();
    let start = Instant::now();
    let offset = Arc::new(AtomicU64::new(0));
    let read = Arc::clone(&offset);
    a.now = Box::new(move || start + Duration::from_millis(read.load(Ordering::SeqCst)));
    (Arc::new(a), offset)
}

fn secret(secret: &str) -> Credentials<'_> {
    Credentials::ClientSecret {
        id: "app-id",
        secret,
    }
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(f).poll(&mut cx)
}

#[test]
fn a_verified_secret_is_cached_for_the_ttl_then_verified_again() {
    let (a, offset) = with_client_and_time();
    let ttl = VERIFIED_TTL.as_secs() * 1_000;
    assert_eq!(
        a.authenticate(secret("s3cret"), None).unwrap().name(),
        "app"
    );
    assert_eq!(a.argon2_runs(), 1);
    // From the cache, without argon2, until the TTL is over.
    for at in [0, 1_000, ttl - 1] {
        offset.store(at, Ordering::SeqCst);
        assert_eq!(
            a.authenticate(secret("s3cret"), None).unwrap().name(),
            "app"
        );
    }
    assert_eq!(a.argon2_runs(), 1, "answered from the cache");
    // A wrong secret is verified (and refused) every time, and does not
    // displace the right one.
    assert!(a.authenticate(secret("wrong"), None).is_err());
    assert!(a.authenticate(secret("wrong"), None).is_err());
    assert_eq!(a.argon2_runs(), 3);
    assert!(a.authenticate(secret("s3cret"), None).is_ok());
    assert_eq!(a.argon2_runs(), 3);
    // Expired: verified again, then cached again from then on.
    offset.store(ttl, Ordering::SeqCst);
    assert!(a.authenticate(secret("s3cret"), None).is_ok());
    assert_eq!(a.argon2_runs(), 4, "verified again once expired");
    offset.store(ttl + 1_000, Ordering::SeqCst);
    assert!(a.authenticate(secret("s3cret"), None).is_ok());
    assert_eq!(a.argon2_runs(), 4);
}

#[test]
fn the_cache_holds_at_most_one_entry_per_configured_client() {
    let (a, offset) = with_client_and_time();
    for s in ["wrong", "s3cret", "s3cret", "also wrong"] {
        let _ = a.authenticate(secret(s), None);
    }
    for id in ["other", "third"] {
        let _ = a.authenticate(
            Credentials::ClientSecret {
                id,
                secret: "s3cret",
            },
            None,
        );
    }
    assert_eq!(a.verified.lock().unwrap().len(), 1);
    // An expired entry is dropped when looked up.
    offset.store(VERIFIED_TTL.as_secs() * 1_000, Ordering::SeqCst);
    assert!(a.quick(secret("s3cret"), None).is_none(), "needs argon2");
    assert!(a.verified.lock().unwrap().is_empty());
}

#[tokio::test]
async fn async_callers_run_argon2_on_the_blocking_pool_and_not_a_cached_check() {
    let (a, _) = with_client_and_time();
    // Not cached: the future waits for the blocking pool.
    let mut first = std::pin::pin!(a.authenticate_async(secret("s3cret"), None, None));
    assert!(poll_once(&mut first).is_pending(), "argon2 runs elsewhere");
    assert_eq!(first.await.unwrap().name(), "app");
    assert_eq!(a.argon2_runs(), 1);
    // Cached: ready when first polled.
    let mut again = std::pin::pin!(a.authenticate_async(secret("s3cret"), None, None));
    match poll_once(&mut again) {
        std::task::Poll::Ready(p) => assert_eq!(p.unwrap().name(), "app"),
        std::task::Poll::Pending => panic!("a cached secret needs no wait"),
    }
    assert_eq!(a.argon2_runs(), 1);
    // Refusals that need no argon2 are immediate too.
    let mut unknown = std::pin::pin!(a.authenticate_async(
        Credentials::ClientSecret {
            id: "other",
            secret: "x",
        },
        None,
        None,
    ));
    assert!(matches!(
        poll_once(&mut unknown),
        std::task::Poll::Ready(Err(AuthError::Unauthenticated(_)))
    ));
    let wrong = a.authenticate_async(secret("wrong"), None, None).await;
    assert!(matches!(wrong, Err(AuthError::Unauthenticated(_))));
    assert_eq!(a.argon2_runs(), 2);
}

#[tokio::test]
async fn wrong_secrets_from_one_address_stop_its_checks_of_that_client_for_a_while() {
    let (a, offset) = with_client_and_time();
    let from = |last: u8| Some(IpAddr::from([10, 0, 0, last]));
    for i in 0..MAX_FAILED_CHECKS {
        offset.store(i as u64 * 10_000, Ordering::SeqCst);
        let r = a.authenticate_async(secret("guess"), None, from(1)).await;
        assert!(matches!(r, Err(AuthError::Unauthenticated(_))), "{r:?}");
    }
    assert_eq!(a.argon2_runs(), 5);
    // Closed to that address for that client id, the right secret too,
    // without an argon2 check: until the first wrong one is
    // FAILED_CHECK_WINDOW old (it was 40 s ago).
    for s in ["guess", "s3cret"] {
        match a.authenticate_async(secret(s), None, from(1)).await {
            Err(AuthError::Throttled {
                message,
                retry_after_secs,
            }) => {
                assert_eq!(retry_after_secs, 260, "{message}");
                assert!(message.contains("\"app-id\" from 10.0.0.1"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(a.argon2_runs(), 5, "no check while closed");
    // Another address is checked as usual.
    let other = a.authenticate_async(secret("guess"), None, from(2)).await;
    assert!(matches!(other, Err(AuthError::Unauthenticated(_))));
    assert_eq!(a.argon2_runs(), 6);
    // Once the first wrong secret is old enough, checked again; the
    // right secret works and forgets the address's wrong ones.
    offset.store(FAILED_CHECK_WINDOW.as_secs() * 1_000, Ordering::SeqCst);
    assert_eq!(
        a.authenticate_async(secret("s3cret"), None, from(1))
            .await
            .unwrap()
            .name(),
        "app"
    );
    assert_eq!(a.argon2_runs(), 7);
    assert!(!a.failures.remembers(&(from(1), "app-id".into())));
}

#[test]
fn certificates_are_known_by_fingerprint() {
    let der = b"not really a certificate, but bytes all the same";
    let mut c = principal("edge");
    c.cert_sha256 = vec![hex_sha256(der)];
    let a = Authenticator::new(&[c]).unwrap();
    assert!(a.uses_certificates());
    assert_eq!(
        a.authenticate(Credentials::None, Some(der)).unwrap().name(),
        "edge"
    );
    assert!(a.authenticate(Credentials::None, Some(b"other")).is_err());
}

#[test]
fn bad_configurations_name_the_principal_and_key() {
    let cases: Vec<(PrincipalConfig, &str)> = vec![
        (
            PrincipalConfig {
                name: "x".into(),
                ..Default::default()
            },
            "name",
        ),
        (
            PrincipalConfig {
                name: "x".into(),
                client_id: Some("id".into()),
                ..Default::default()
            },
            "secret_hash",
        ),
        (
            PrincipalConfig {
                name: "x".into(),
                client_id: Some("id".into()),
                secret_hash: Some("plain-text".into()),
                ..Default::default()
            },
            "secret_hash",
        ),
        (
            PrincipalConfig {
                name: "x".into(),
                token_sha256: vec!["abc".into()],
                ..Default::default()
            },
            "token_sha256",
        ),
        (
            PrincipalConfig {
                admin: vec![String::new()],
                ..principal("x")
            },
            "admin",
        ),
    ];
    for (c, key) in cases {
        let e = Authenticator::new(&[c]).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.to_string().contains("principals[0] (x)"), "{e}");
    }
    let dup = Authenticator::new(&[principal("a"), principal("a")]).unwrap_err();
    assert_eq!(dup.key, "name");
    assert_eq!(dup.index, 1);
}

#[test]
fn aws_keys_take_their_secret_from_a_file_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "s3cret-access-key\nignored\n").unwrap();
    let (id, secret) = new_aws_key();
    assert_eq!(id.len(), 20);
    assert!(id.starts_with("LBK") && id.chars().all(|c| c.is_ascii_alphanumeric()));
    assert_eq!(secret.len(), 40);
    let p = |name: &str, key: Option<&str>, file: Option<&std::path::Path>| PrincipalConfig {
        name: name.into(),
        aws_access_key_id: key.map(str::to_string),
        aws_secret_access_key_file: file.map(std::path::Path::to_path_buf),
        consume: vec!["q".into()],
        ..PrincipalConfig::default()
    };
    let a = Authenticator::new(&[p("app", Some(&id), Some(&file))]).unwrap();
    let (s, who) = a.aws_key(&id).expect("the key");
    assert_eq!(s, "s3cret-access-key");
    assert_eq!(who.name(), "app");
    assert!(who.allows(Action::Consume, "q") && !who.allows(Action::Admin, "q"));
    assert!(a.aws_key("LBKNOTAKEYATALL00000").is_none());
    let key = |e: AuthConfigError| (e.key, e.reason);
    let missing = dir.path().join("nope");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    for (bad, want) in [
        (p("a", Some("short"), Some(&file)), "aws_access_key_id"),
        (
            p("a", Some("LBK-NOT/VALID-000000"), Some(&file)),
            "aws_access_key_id",
        ),
        (p("a", Some(&id), None), "aws_secret_access_key_file"),
        (p("a", None, Some(&file)), "aws_access_key_id"),
        (
            p("a", Some(&id), Some(&missing)),
            "aws_secret_access_key_file",
        ),
        (
            p("a", Some(&id), Some(&empty)),
            "aws_secret_access_key_file",
        ),
    ] {
        let (k, reason) = key(Authenticator::new(&[bad]).unwrap_err());
        assert_eq!(k, want, "{reason}");
    }
    let twice = Authenticator::new(&[
        p("a", Some(&id), Some(&file)),
        p("b", Some(&id), Some(&file)),
    ])
    .unwrap_err();
    assert_eq!((twice.index, twice.key), (1, "aws_access_key_id"));
    assert!(
        twice.reason.contains("earlier principal"),
        "{}",
        twice.reason
    );
}
