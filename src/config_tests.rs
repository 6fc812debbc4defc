//! Tests of `src/config.rs`: flags, variables and the file, merged and
//! checked.

use super::*;
use clap::FromArgMatches;

fn parse(argv: &[&str], file: &str) -> Result<ServeArgs, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("letterbox.toml");
    std::fs::write(&path, file).unwrap();
    let cmd = || ServeArgs::augment_args(Command::new("serve"));
    let mut full: Vec<OsString> = vec!["serve".into()];
    full.extend(argv.iter().map(OsString::from));
    let given = cmd()
        .try_get_matches_from(&full)
        .map_err(|e| e.to_string())?;
    let settings = read_config_file(&path, &given)?;
    full.extend(settings.args);
    let m = cmd()
        .try_get_matches_from(&full)
        .map_err(|e| e.to_string())?;
    let mut args = ServeArgs::from_arg_matches(&m).map_err(|e| e.to_string())?;
    args.principals = settings.principals;
    Ok(args)
}

#[test]
fn store_flags_are_checked_and_name_the_flag() {
    let c = parse(&["--data-dir", "/tmp/x"], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert!(c.remote.is_none(), "the data directory by default");
    let c = parse(
        &[
            "--store",
            "postgres://lb:secret@db1,db2/letterbox?target_session_attrs=read-write",
            "--standby",
            "--listen",
            "127.0.0.1:6000",
        ],
        "lease_ttl = \"3s\"\nnode_name = \"n1\"",
    )
    .unwrap()
    .server_config()
    .unwrap();
    let r = c.remote.expect("remote store");
    assert!(r.standby);
    assert_eq!(r.node, "n1");
    assert_eq!(r.lease_ttl, Duration::from_secs(3));
    assert!(!format!("{r:?}").contains("secret"), "{r:?}");
    let r = parse(
        &["--store", "postgres://db/x", "--listen", "127.0.0.1:6001"],
        "",
    )
    .unwrap()
    .server_config()
    .unwrap()
    .remote
    .unwrap();
    assert!(r.node.ends_with(":6001"), "{}", r.node);
    for (argv, want) in [
        (&["--standby"][..], "--standby: needs --store"),
        (&["--node-name", "a"][..], "--node-name: needs --store"),
        (
            &["--store", "mysql://db/x"][..],
            "scheme \"mysql\" is not postgres",
        ),
        (
            &["--store", "db1"][..],
            "--store / LETTERBOX_STORE: not a URL",
        ),
        (
            &["--store", "postgres://db/x", "--lease-ttl", "100ms"][..],
            "--lease-ttl / LETTERBOX_LEASE_TTL: must be at least 1s",
        ),
        (
            &["--store", "postgres://db/x", "--node-name", " "][..],
            "the name is empty",
        ),
    ] {
        let e = parse(argv, "").unwrap().server_config().unwrap_err();
        assert!(e.contains(want), "{argv:?}: {e}");
    }
}

#[test]
fn the_console_is_on_beside_a_loopback_listener_unless_turned_off() {
    use crate::server::ConsoleAt;
    let c = parse(&["--data-dir", "/tmp/x"], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(
        c.console_listen,
        Some(ConsoleAt::Preferred("127.0.0.1:8025".parse().unwrap()))
    );
    let c = parse(&["--console-listen", "off"], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.console_listen, None);
    let c = parse(&[], "console_listen = \"127.0.0.1:9000\"\n")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(
        c.console_listen,
        Some(ConsoleAt::Exactly("127.0.0.1:9000".parse().unwrap()))
    );
    let e = parse(&["--console-listen", "soon"], "").unwrap_err();
    assert!(e.contains("\"soon\" is neither an address"), "{e}");
    // On the network without principals: refused, like gRPC.
    let e = parse(&["--console-listen", "0.0.0.0:8025"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(
        e.contains("--console-listen") && e.contains("0.0.0.0:8025"),
        "{e}"
    );
    // A gRPC listener on the network gets no console unless asked.
    let c = parse(
        &["--listen", "0.0.0.0:5672", "--allow-remote-without-auth"],
        "",
    )
    .unwrap()
    .server_config()
    .unwrap();
    assert_eq!(c.console_listen, None);
}

#[test]
fn the_file_fills_what_flags_leave_unset() {
    let a = parse(
        &["--max-message-size", "2MiB"],
        "max_message_size = \"1MiB\"\ncheckpoint-interval = \"5s\"\nmax_concurrent_streams = 7\ntls_require_client_cert = false\n",
    )
    .unwrap();
    assert_eq!(a.max_message_size, ByteSize(2 << 20), "the flag wins");
    assert_eq!(a.checkpoint_interval, Millis(Duration::from_secs(5)));
    assert_eq!(a.max_concurrent_streams, 7);
    assert!(!a.tls_require_client_cert);
}

#[test]
fn connection_limits_come_from_flags_and_the_file_and_are_checked() {
    let c = parse(
        &[
            "--max-connections-per-address",
            "50",
            "--header-timeout",
            "5s",
        ],
        "listener_reserve = 20\n",
    )
    .unwrap()
    .server_config()
    .unwrap();
    assert_eq!(c.limits.max_connections_per_address, Some(50));
    assert_eq!(c.limits.listener_reserve, Some(20));
    assert_eq!(c.limits.header_timeout, Duration::from_secs(5));
    let d = parse(&[], "").unwrap().server_config().unwrap();
    assert_eq!(d.limits.max_connections_per_address, None, "derived");
    assert_eq!(d.limits.listener_reserve, None, "derived");
    assert_eq!(d.limits.header_timeout, Duration::from_secs(30));
    for (argv, want) in [
        (
            ["--max-connections-per-address", "0"],
            "--max-connections-per-address: must be at least 1",
        ),
        (
            ["--header-timeout", "10ms"],
            "--header-timeout: must be at least 100ms",
        ),
    ] {
        let e = parse(&argv, "").unwrap().server_config().unwrap_err();
        assert!(e.contains(want), "{argv:?}: {e}");
    }
}

#[test]
fn principals_come_from_the_file() {
    let a = parse(
        &[],
        r#"
[[principals]]
name = "orders"
token_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
publish = ["orders"]
"#,
    )
    .unwrap();
    assert_eq!(a.principals.len(), 1);
    assert_eq!(a.principals[0].publish, vec!["orders".to_string()]);
    let c = a.server_config().unwrap();
    assert!(c.auth.is_enabled());
}

#[test]
fn errors_name_the_key() {
    let e = parse(&[], "max_mesage_size = 1\n").unwrap_err();
    assert!(e.contains("unknown key `max_mesage_size`"), "{e}");
    let e = parse(&[], "max_message_size = \"lots\"\n").unwrap_err();
    assert!(e.contains("key `max_message_size`"), "{e}");
    let e = parse(&[], "allow_remote_without_auth = \"yes\"\n").unwrap_err();
    assert!(e.contains("key `allow_remote_without_auth`"), "{e}");
    let e = parse(&[], "[[principals]]\nname = \"x\"\ncolour = 1\n").unwrap_err();
    assert!(e.contains("principals") && e.contains("colour"), "{e}");
    let e = parse(&[], "listen = [1]\n").unwrap_err();
    assert!(e.contains("key `listen`"), "{e}");
    let e = parse(&[], "not toml at all").unwrap_err();
    assert!(e.contains("--config"), "{e}");
    let a = parse(&[], "[[principals]]\nname = \"x\"\n").unwrap();
    let e = a.server_config().unwrap_err();
    assert!(e.contains("principals[0] (x)"), "{e}");
}

#[test]
fn the_memory_bounds_reach_the_store_and_the_unapplied_one_has_a_floor() {
    let e = parse(&["--max-unapplied", "64KiB"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("--max-unapplied") && e.contains("65536"), "{e}");
    let c = parse(&[], "max_unapplied = \"32MiB\"\n")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.store.max_unapplied_bytes, 32 << 20);
    assert_eq!(c.store.recent_payload_bytes, 64 << 20, "the default");
    let c = parse(&["--recent-payloads", "0"], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.store.recent_payload_bytes, 0, "0 keeps no bodies");
}

#[test]
fn remote_listening_needs_auth_or_an_explicit_flag() {
    let a = parse(&["--listen", "0.0.0.0:0"], "").unwrap();
    let e = a.server_config().unwrap_err();
    assert!(e.contains("--allow-remote-without-auth"), "{e}");
    let a = parse(
        &["--listen", "0.0.0.0:0"],
        "allow_remote_without_auth = true\n",
    )
    .unwrap();
    assert!(a.server_config().is_ok());
    let a = parse(&["--listen", "[::1]:0"], "").unwrap();
    assert!(a.server_config().is_ok());
}

/// The configuration the Debian package installs
/// (`packaging/letterbox.toml`) starts the server as it is, and its
/// commented examples are real keys with valid values.
#[test]
fn the_packaged_configuration_starts_as_is_and_its_examples_are_valid() {
    let shipped = include_str!("../packaging/letterbox.toml");
    let a = parse(&[], shipped).unwrap();
    assert_eq!(a.data_dir, PathBuf::from("/var/lib/letterbox/data"));
    assert_eq!(a.listen, "127.0.0.1:50051".parse().unwrap());
    assert_eq!(a.log_format, LogFormat::Json);
    assert!(a.principals.is_empty());
    let c = a.server_config().unwrap();
    assert!(!c.auth.is_enabled());

    let (settings, principals) = shipped
        .split_once("#[[principals]]")
        .expect("a commented principals example");
    let mut keys = std::collections::HashSet::new();
    let mut examples = String::new();
    for line in settings.lines() {
        let Some(line) = line.strip_prefix('#') else {
            continue;
        };
        if let Some((key, _)) = line.split_once(" = ")
            && !key.contains(' ')
            && keys.insert(key.to_string())
        {
            examples.push_str(line);
            examples.push('\n');
        }
    }
    assert!(keys.len() >= 13, "{keys:?}");
    let a = parse(&[], &examples).unwrap();
    assert_eq!(a.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert!(a.tls_require_client_cert);

    let principals: String = format!("#[[principals]]{principals}")
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let a = parse(&[], &principals).unwrap();
    let names: Vec<&str> = a.principals.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["ops", "orders-service", "billing-sqs"]);
}

#[test]
fn the_metrics_token_comes_from_a_file_or_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.token");
    std::fs::write(&file, "  s3cret-token\n").unwrap();
    let f = file.display().to_string();
    let c = parse(&["--metrics-token-file", &f], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.metrics_token.as_deref(), Some("s3cret-token"));
    let c = parse(&[], "metrics_token = \"from-the-file\"\n")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.metrics_token.as_deref(), Some("from-the-file"));
    let c = parse(&[], "").unwrap().server_config().unwrap();
    assert_eq!(c.metrics_token, None);
    std::fs::write(&file, "\n").unwrap();
    let e = parse(&["--metrics-token-file", &f], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(
        e.contains("--metrics-token-file: the token is empty"),
        "{e}"
    );
    let e = parse(&["--metrics-token", "two words"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("--metrics-token"), "{e}");
    let e = parse(&["--metrics-token-file", &f, "--metrics-token", "t"], "").unwrap_err();
    assert!(e.contains("--metrics-token"), "{e}");
}

#[test]
fn tls_settings_are_checked_together() {
    let e = parse(&["--tls-cert", "/nonexistent.pem"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("--tls-key"), "{e}");
    let e = parse(
        &["--tls-cert", "/nonexistent.pem", "--tls-key", "/k.pem"],
        "",
    )
    .unwrap()
    .server_config()
    .unwrap_err();
    assert!(e.contains("--tls-cert: /nonexistent.pem"), "{e}");
    let e = parse(&["--tls-client-ca", "/ca.pem"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("need --tls-cert"), "{e}");
}

#[test]
fn the_sqs_endpoint_is_on_beside_a_loopback_listener_unless_turned_off() {
    use crate::server::ConsoleAt;
    let c = parse(&[], "").unwrap().server_config().unwrap();
    assert_eq!(
        c.sqs_listen,
        Some(ConsoleAt::Preferred("127.0.0.1:9324".parse().unwrap()))
    );
    assert_eq!(c.sqs.account_id, "000000000000");
    assert_eq!(c.sqs.region, "us-east-1");
    let c = parse(&["--sqs-listen", "off"], "")
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(c.sqs_listen, None);
    let c = parse(
        &[],
        "sqs_listen = \"127.0.0.1:5000\"\nsqs_account_id = \"123456789012\"\nsqs_region = \"eu-west-1\"\n",
    )
    .unwrap()
    .server_config()
    .unwrap();
    assert_eq!(
        c.sqs_listen,
        Some(ConsoleAt::Exactly("127.0.0.1:5000".parse().unwrap()))
    );
    assert_eq!(c.sqs.account_id, "123456789012");
    assert_eq!(c.sqs.region, "eu-west-1");
    let e = parse(&["--sqs-listen", "0.0.0.0:9324"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(
        e.contains("--sqs-listen") && e.contains("0.0.0.0:9324"),
        "{e}"
    );
    let e = parse(&["--sqs-account-id", "12ab"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("--sqs-account-id") && e.contains("12ab"), "{e}");
    let e = parse(&["--sqs-region", "Moon 1"], "")
        .unwrap()
        .server_config()
        .unwrap_err();
    assert!(e.contains("--sqs-region"), "{e}");
    // A gRPC listener on the network gets no SQS endpoint unless asked.
    let c = parse(
        &["--listen", "0.0.0.0:50051", "--allow-remote-without-auth"],
        "",
    )
    .unwrap()
    .server_config()
    .unwrap();
    assert_eq!(c.sqs_listen, None);
}
