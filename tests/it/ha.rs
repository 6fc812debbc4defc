//! Two Letterbox nodes on one PostgreSQL (`--store`): the owner killed
//! with SIGKILL and a standby taking over with nothing acknowledged lost
//! or repeated and delivery counts exact; an owner paused past its lease
//! (SIGSTOP) fenced when it resumes, its writes refused, and stepping
//! down; PostgreSQL itself down past the owner's lease (the owner stops,
//! the standby waits and takes over). PostgreSQL is started for each test on a loopback port by
//! `tools/services/pg-local.sh` (as the `postgres` user under root); without
//! Debian's `postgresql` the tests skip, unless
//! LETTERBOX_REQUIRE_ECOSYSTEM=1, when they fail.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use letterbox::client::{Client, ClientConfig, pb};

use crate::harness::{fresh_database, spawn, with_dlq};

/// A PostgreSQL of its own, stopped on drop.
struct Pg {
    dir: tempfile::TempDir,
    url: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/services/pg-local.sh")
}

impl Pg {
    fn start(test: &str) -> Option<Pg> {
        if !std::path::Path::new("/usr/lib/postgresql").exists() {
            let why =
                "no PostgreSQL programs under /usr/lib/postgresql (apt-get install postgresql)";
            assert!(
                std::env::var("LETTERBOX_REQUIRE_ECOSYSTEM").as_deref() != Ok("1"),
                "{test}: {why}"
            );
            eprintln!("SKIP {test}: {why}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = free_addr().port().to_string();
        let out = Command::new("bash")
            .arg(script())
            .args(["start", &dir.path().join("pg").display().to_string(), &port])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg-local.sh start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Some(Pg { dir, url })
    }
}

impl Pg {
    /// Stops it at once, as a crash would ("immediate": no checkpoint,
    /// connections cut).
    fn crash(&self) {
        self.ctl("stop");
    }

    /// Starts it again on its data and port (crash recovery).
    fn up(&self) {
        self.ctl("up");
    }

    fn ctl(&self, cmd: &str) {
        let out = Command::new("bash")
            .arg(script())
            .args([cmd, &self.dir.path().join("pg").display().to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg-local.sh {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", &self.dir.path().join("pg").display().to_string()])
            .output();
    }
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A node of the pair: the binary with `--store`, on a fixed port (so a
/// client can list it before it serves).
struct Node {
    child: Option<Child>,
    addr: SocketAddr,
    log: PathBuf,
}

impl Node {
    /// Starts a node and returns once it serves (for a standby: once it
    /// has taken over), or panics when it has not within `spawn`'s wait.
    async fn start(
        dir: &tempfile::TempDir,
        name: &str,
        url: &str,
        addr: SocketAddr,
        standby: bool,
    ) -> Node {
        Node::start_with(dir, name, url, addr, standby, &[]).await
    }

    /// [`Node::start`] with more flags.
    async fn start_with(
        dir: &tempfile::TempDir,
        name: &str,
        url: &str,
        addr: SocketAddr,
        standby: bool,
        extra: &[&str],
    ) -> Node {
        let log = dir.path().join(format!("{name}.log"));
        let mut args: Vec<String> = ["--store", url, "--node-name", name, "--listen"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(addr.to_string());
        if !extra.contains(&"--lease-ttl") {
            args.extend(["--lease-ttl".to_string(), "2s".to_string()]);
        }
        if standby {
            args.push("--standby".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let data = dir.path().join(format!("{name}-data"));
        let l = log.clone();
        let (child, got) = tokio::task::spawn_blocking(move || spawn(&data, &l, &args))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("node {name}: {e}"));
        assert_eq!(got, addr);
        Node {
            child: Some(child),
            addr,
            log,
        }
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = self.child.as_ref().expect("running").id();
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `within` for the process to end by itself and returns
    /// its exit status, or panics naming `who` with the node's log.
    async fn wait_exit(&mut self, within: Duration, who: &str) -> std::process::ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.as_mut().expect("running").try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(Instant::now() < until, "{who} still runs:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.signal_cont();
        }
        self.kill();
    }
}

impl Node {
    fn signal_cont(&self) -> Option<()> {
        let pid = self.child.as_ref()?.id();
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).ok()
    }
}

/// A client of the pair that keeps trying while the standby takes over.
async fn pair_client(a: SocketAddr, b: SocketAddr) -> Client {
    let mut c = ClientConfig::new(format!("http://{a},http://{b}"));
    c.retry.max_attempts = 60;
    c.retry.max_backoff = Duration::from_millis(200);
    Client::with_config(c).await.unwrap()
}

fn body(d: &pb::Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

#[tokio::test]
async fn the_standby_takes_over_when_the_owner_is_killed() {
    let Some(pg) = Pg::start("the_standby_takes_over_when_the_owner_is_killed") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(&pg.url).await;
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let mut a = Node::start(&dir, "a", &url, addr_a, false).await;
    // The standby waits (it does not serve) while the owner holds the lease.
    let standby = {
        let (dir_path, url) = (dir.path().to_path_buf(), url.clone());
        tokio::spawn(async move {
            let d = tempfile::TempDir::new_in(dir_path).unwrap();
            let n = Node::start(&d, "b", &url, addr_b, true).await;
            (n, d)
        })
    };
    let c = pair_client(addr_a, addr_b).await;
    let config = pb::QueueConfig {
        ack_timeout_ms: Some(1000),
        ..with_dlq("jobs.dlq", 3)
    };
    c.create_queue("jobs.dlq", pb::QueueConfig::default())
        .await
        .unwrap();
    c.create_queue("jobs", config).await.unwrap();
    let msgs: Vec<pb::PublishMessage> = (0..40)
        .map(|i| Client::message_with_id(format!("m{i}"), format!("body-{i}")))
        .collect();
    c.publish("jobs", msgs).await.unwrap();
    // Ten acked (gone for good), five leased and not acked (back after
    // their lease, counted once), the rest never delivered.
    let got = c.receive("jobs", 15, Duration::from_secs(1)).await.unwrap();
    assert_eq!(got.len(), 15);
    let (acked, leased) = got.split_at(10);
    c.ack(acked.iter().map(|d| d.ack_token.clone()).collect())
        .await
        .unwrap();
    let acked: Vec<String> = acked.iter().map(body).collect();
    let leased: Vec<String> = leased.iter().map(body).collect();
    assert!(
        !standby.is_finished(),
        "the standby serves while the owner lives"
    );

    a.kill();
    let killed = Instant::now();
    // Published through the pair while the standby takes over: retried
    // (it has an id) until the new owner answers.
    c.publish("jobs", vec![Client::message_with_id("after", "after")])
        .await
        .unwrap();
    let failover = killed.elapsed();
    let (b, _bdir) = standby.await.unwrap();
    assert_eq!(c.endpoint(), format!("http://{}", b.addr));
    assert!(
        failover < Duration::from_secs(20),
        "first publish after the kill took {failover:?}"
    );

    // Everything not acked is there once, with its delivery count.
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(10);
    while seen.len() < 31 && Instant::now() < until {
        for d in c
            .receive("jobs", 100, Duration::from_millis(300))
            .await
            .unwrap()
        {
            assert!(
                seen.insert(body(&d), d.delivery_count).is_none(),
                "{} delivered twice after the failover",
                body(&d)
            );
            c.ack(vec![d.ack_token.clone()]).await.unwrap();
        }
    }
    for b in &acked {
        assert!(!seen.contains_key(b), "acked {b} delivered again");
    }
    for b in &leased {
        assert_eq!(seen.get(b), Some(&2), "{b}: leased once before the kill");
    }
    assert_eq!(seen.get("after"), Some(&1));
    assert_eq!(seen.len(), 30 + 1, "{seen:?}\n{}", b.log());
}

/// A node started without `--standby` while another owns the queues says
/// so and names `--standby`; a standby waiting for the lease logs no
/// PostgreSQL notice at each attempt (its schema check's `relation ...
/// already exists, skipping`).
#[tokio::test]
async fn a_held_lease_names_standby_and_a_waiting_standby_stays_quiet() {
    let Some(pg) = Pg::start("a_held_lease_names_standby_and_a_waiting_standby_stays_quiet") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(&pg.url).await;
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let _a = Node::start(&dir, "a", &url, addr_a, false).await;

    let log = dir.path().join("b.log");
    let args: Vec<String> = [
        "--store",
        &url,
        "--node-name",
        "b",
        "--listen",
        &addr_b.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (data, l) = (dir.path().join("b-data"), log.clone());
    let refused = tokio::task::spawn_blocking(move || spawn(&data, &l, &args))
        .await
        .unwrap();
    let Err(text) = refused else {
        panic!("a second owner started");
    };
    assert!(
        text.contains("another node, \"a\" (epoch 1), owns the queues in PostgreSQL")
            && text.contains("start this node with --standby"),
        "{text}"
    );

    // A standby polls every third of its 2 s lease: over 3 s, several
    // attempts, none of them logging PostgreSQL's notices.
    let data = dir.path().join("c-data");
    let log = dir.path().join("c.log");
    let mut serve = letterbox::launch::Serve::new(env!("CARGO_BIN_EXE_letterbox"), &data);
    serve
        .command()
        .args([
            "--store",
            &url,
            "--node-name",
            "c",
            "--standby",
            "--lease-ttl",
            "2s",
        ])
        .args(["--listen", &free_addr().to_string()])
        .env("LETTERBOX_LOG", "info");
    let mut c = serve.spawn(std::fs::File::create(&log).unwrap()).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = c.child.kill();
    let _ = c.child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("standby: another node owns the queues"),
        "{text}"
    );
    assert!(!text.contains("already exists, skipping"), "{text}");
    assert!(!text.contains("NOTICE"), "{text}");
}

#[tokio::test]
async fn a_paused_owner_is_fenced_and_steps_down() {
    let Some(pg) = Pg::start("a_paused_owner_is_fenced_and_steps_down") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(&pg.url).await;
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let mut a = Node::start(&dir, "a", &url, addr_a, false).await;
    let only_a = Client::connect(format!("http://{addr_a}")).await.unwrap();
    only_a
        .create_queue("q", pb::QueueConfig::default())
        .await
        .unwrap();
    only_a
        .publish("q", vec![Client::message_with_id("before", "before")])
        .await
        .unwrap();

    // Paused past its lease: the standby takes over.
    a.signal(rustix::process::Signal::STOP);
    let b = Node::start(&dir, "b", &url, addr_b, true).await;
    let only_b = Client::connect(format!("http://{addr_b}")).await.unwrap();
    only_b
        .publish("q", vec![Client::message_with_id("on-b", "on-b")])
        .await
        .unwrap();

    // A publish sent to the paused owner is answered once it resumes: with
    // an error, and nothing of it is stored.
    let late = tokio::spawn(async move {
        let mut cfg = ClientConfig::new(format!("http://{addr_a}"));
        cfg.retry.max_attempts = 1;
        let c = Client::with_config(cfg).await;
        match c {
            Ok(c) => c
                .publish("q", vec![Client::message_with_id("zombie", "zombie")])
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.signal(rustix::process::Signal::CONT);
    let answer = late.await.unwrap();
    assert!(answer.is_err(), "a fenced owner acknowledged a publish");

    // It steps down: the process ends with an error naming the fence.
    let status = a
        .wait_exit(Duration::from_secs(15), "the fenced owner")
        .await;
    assert!(!status.success(), "{}", a.log());
    let log = a.log();
    assert!(log.contains("epoch"), "the stop names the fence:\n{log}");

    let got = only_b
        .receive("q", 10, Duration::from_millis(300))
        .await
        .unwrap();
    let mut bodies: Vec<String> = got.iter().map(body).collect();
    bodies.sort();
    assert_eq!(bodies, ["before", "on-b"], "{}", b.log());
}

/// PostgreSQL down for longer than the lease (2 s): the owner stops
/// (fail-stop) and the standby, which cannot reach
/// PostgreSQL either, keeps waiting; once PostgreSQL is back the standby
/// takes over and serves everything acknowledged before.
#[tokio::test]
async fn a_postgresql_outage_longer_than_the_lease_stops_the_owner_and_the_standby_waits_it_out() {
    let test =
        "a_postgresql_outage_longer_than_the_lease_stops_the_owner_and_the_standby_waits_it_out";
    let Some(pg) = Pg::start(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(&pg.url).await;
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let mut a = Node::start(&dir, "a", &url, addr_a, false).await;
    let standby = {
        let (dir_path, url) = (dir.path().to_path_buf(), url.clone());
        tokio::spawn(async move {
            let d = tempfile::TempDir::new_in(dir_path).unwrap();
            let n = Node::start(&d, "b", &url, addr_b, true).await;
            (n, d)
        })
    };
    let only_a = Client::connect(format!("http://{addr_a}")).await.unwrap();
    only_a
        .create_queue("q", pb::QueueConfig::default())
        .await
        .unwrap();
    let msgs: Vec<pb::PublishMessage> = (0..5)
        .map(|i| Client::message_with_id(format!("m{i}"), format!("m{i}")))
        .collect();
    only_a.publish("q", msgs).await.unwrap();

    pg.crash();
    // The owner stops, exit code 3: its lease (2 s) runs out unrenewed, or
    // a commit or a read meets the lost connection first.
    let status = a
        .wait_exit(Duration::from_secs(20), "with PostgreSQL down, the owner")
        .await;
    assert_eq!(status.code(), Some(3), "{}", a.log());
    assert!(
        a.log().contains("PostgreSQL backend stopped"),
        "{}",
        a.log()
    );
    // The standby waits: it neither serves nor gives up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !standby.is_finished(),
        "the standby served with PostgreSQL down"
    );

    pg.up();
    let (b, _bdir) = tokio::time::timeout(Duration::from_secs(30), standby)
        .await
        .expect("the standby did not take over once PostgreSQL was back")
        .unwrap();
    assert!(
        b.log().contains("standby: cannot reach PostgreSQL"),
        "the standby did not meet the outage:\n{}",
        b.log()
    );
    let only_b = Client::connect(format!("http://{addr_b}")).await.unwrap();
    let mut got: Vec<String> = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.len() < 5 && Instant::now() < until {
        for d in only_b
            .receive("q", 10, Duration::from_millis(300))
            .await
            .unwrap()
        {
            got.push(body(&d));
            only_b.ack(vec![d.ack_token.clone()]).await.unwrap();
        }
    }
    got.sort();
    assert_eq!(got, ["m0", "m1", "m2", "m3", "m4"], "{}", b.log());
}

/// The value of the sample `name` (no labels) in a metrics text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

/// The commit path on PostgreSQL in the metrics: every acknowledged
/// change counted in the commit wait, and the PostgreSQL transactions
/// that committed them with how many each carried.
#[tokio::test]
async fn the_postgresql_store_reports_its_commits_in_the_metrics() {
    let Some(pg) = Pg::start("the_postgresql_store_reports_its_commits_in_the_metrics") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_database(&pg.url).await;
    let (addr, metrics) = (free_addr(), free_addr());
    let metrics_flag = metrics.to_string();
    let _node = Node::start_with(
        &dir,
        "m",
        &url,
        addr,
        false,
        &["--metrics-listen", &metrics_flag],
    )
    .await;
    let c = Client::connect(format!("http://{addr}")).await.unwrap();
    c.create_queue("jobs", pb::QueueConfig::default())
        .await
        .unwrap();
    for i in 0..5 {
        c.publish("jobs", vec![Client::message(format!("body-{i}"))])
            .await
            .unwrap();
    }
    let text = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(metrics).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        String::from_utf8_lossy(&raw).into_owned()
    };
    // The queue's creation and five publishes, each acknowledged once
    // committed: six changes at least (the server may commit more of its
    // own), in as many PostgreSQL transactions or fewer.
    let changes = sample(&text, "letterbox_commit_seconds_count");
    assert!(changes >= 6.0, "{changes} changes counted");
    // A batch's size is counted just before its changes' waits end.
    let carried = sample(&text, "letterbox_pg_batch_records_sum");
    assert!(carried >= changes, "{carried} carried, {changes} changes");
    let transactions = sample(&text, "letterbox_pg_transaction_seconds_count");
    assert!(
        transactions >= 1.0 && transactions <= changes,
        "{transactions} transactions"
    );
    assert_eq!(
        sample(&text, "letterbox_pg_batch_records_count"),
        transactions
    );
    // The local log's figures are not made up for a store without one.
    assert!(!text.contains("letterbox_log_sync_seconds"), "{text}");
}
