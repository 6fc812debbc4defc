//! Disk faults (SPEC §6): a full disk, a file system that turns read-only
//! under the server, an fsync that fails, and damaged or lost data at
//! start.
//!
//! The full-disk and read-only tests mount a small tmpfs or a loop-mounted
//! ext4 image (root only; they say why and pass when mounting is not
//! permitted). The failing fsync uses libfiu (`fiu-run`, Debian package
//! `fiu-utils`; skipped with a message when it is not installed).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use letterbox::launch::Serve;
use letterbox::pb;
use tonic::Code;

use crate::harness::*;

/// A mounted file system, unmounted when dropped.
struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Result<Mount, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        run(
            "mount",
            &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"],
            Some(dir),
        )?;
        Ok(Mount {
            dir: dir.to_path_buf(),
        })
    }

    /// An ext4 image of `mib` MiB, loop-mounted with errors=remount-ro.
    fn ext4(image: &Path, dir: &Path, mib: u64) -> Result<Mount, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let f = std::fs::File::create(image).map_err(|e| e.to_string())?;
        f.set_len(mib << 20).map_err(|e| e.to_string())?;
        run("mkfs.ext4", &["-q", "-F"], Some(image))?;
        run(
            "mount",
            &["-o", "loop,errors=remount-ro"],
            Some(&PathBuf::from(format!(
                "{} {}",
                image.display(),
                dir.display()
            ))),
        )?;
        Ok(Mount {
            dir: dir.to_path_buf(),
        })
    }

    /// The block device (e.g. `loop3`) under the mount.
    fn device(&self) -> Option<String> {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.dir)
            .output()
            .ok()?;
        let src = String::from_utf8_lossy(&out.stdout).trim().to_string();
        src.rsplit('/').next().map(str::to_string)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Runs a command; `last` is appended as the last argument(s) (split on
/// one space for the two-path mount).
fn run(cmd: &str, args: &[&str], last: Option<&Path>) -> Result<(), String> {
    let mut c = Command::new(cmd);
    c.args(args);
    if let Some(l) = last {
        for part in l.to_string_lossy().split(' ') {
            c.arg(part);
        }
    }
    let out = c.output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// The server, optionally behind a wrapper command (`fiu-run -x ...`).
fn start(
    wrapper: &[&str],
    data: &Path,
    log: &Path,
    args: &[&str],
) -> Result<(Child, SocketAddr), String> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log");
    let mut serve = Serve::wrapped(wrapper, env!("CARGO_BIN_EXE_letterbox"), data);
    serve
        .command()
        .args(["--listen", "127.0.0.1:0"])
        .args(if args.contains(&"--wal-segment-size") {
            &[][..]
        } else {
            &["--wal-segment-size", "1MiB"][..]
        })
        .args(args)
        .env("LETTERBOX_LOG", "info")
        .env("RUST_BACKTRACE", "0");
    let mut served = serve.spawn(log_file).expect("spawn");
    match served.wait_blocking(|a| a.grpc.is_some(), Duration::from_secs(60)) {
        Ok(()) => Ok((served.child, served.announced.grpc.expect("addr"))),
        Err(e) => Err(format!(
            "{e}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )),
    }
}

async fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

fn term(child: &Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// [`start`], then a client and its queue `q`.
async fn start_with_queue(
    wrapper: &[&str],
    data: &Path,
    log: &Path,
    args: &[&str],
) -> (Child, Clients) {
    let (child, addr) =
        start(wrapper, data, log, args).unwrap_or_else(|e| panic!("start {wrapper:?}: {e}"));
    let mut c = connect(addr).await;
    c.create("q", config()).await;
    (child, c)
}

/// Every message id in queue `q` after a restart (without a wrapper).
async fn ids_after_restart(
    data: &Path,
    log: &Path,
    args: &[&str],
) -> std::collections::BTreeSet<String> {
    let (mut child, addr) = start(&[], data, log, args).expect("restart");
    let mut c = connect(addr).await;
    let have = ids_in_queue(&mut c).await;
    child.kill().unwrap();
    child.wait().unwrap();
    have
}

/// Fails unless every acknowledged publish (`acked`) is in `have`.
fn assert_none_lost(acked: &[String], have: &std::collections::BTreeSet<String>) {
    let lost: Vec<&String> = acked.iter().filter(|id| !have.contains(*id)).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
}

/// Publishes `n` messages of `size` bytes with ids `<prefix>-<i>`.
async fn publish_batch(
    c: &mut Clients,
    prefix: &str,
    from: usize,
    n: usize,
    size: usize,
) -> Result<Vec<String>, tonic::Status> {
    let ids: Vec<String> = (from..from + n).map(|i| format!("{prefix}-{i}")).collect();
    c.msg
        .publish(pb::PublishRequest {
            queue: "q".into(),
            messages: ids
                .iter()
                .map(|id| pb::PublishMessage {
                    message_id: id.clone(),
                    body: vec![b'x'; size].into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .await?;
    Ok(ids)
}

/// Every message id in queue `q`.
async fn ids_in_queue(c: &mut Clients) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut token = String::new();
    loop {
        let r = c
            .admin
            .browse(pb::BrowseRequest {
                queue: "q".into(),
                max_messages: 1000,
                page_token: token,
            })
            .await
            .expect("browse")
            .into_inner();
        out.extend(r.messages.into_iter().map(|m| m.message_id));
        if r.next_page_token.is_empty() {
            return out;
        }
        token = r.next_page_token;
    }
}

#[tokio::test]
async fn a_full_disk_refuses_publishes_keeps_acks_and_resumes_when_space_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let _m = match Mount::tmpfs(&mnt, "64m") {
        Ok(m) => m,
        Err(e) => return skip("disk full", &format!("cannot mount a tmpfs ({e})")),
    };
    // Room for the server: 64 MiB less a 20 MiB filler, with 16 MiB kept
    // free.
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![0u8; 20 << 20]).unwrap();
    let data = mnt.join("data");
    let log = tmp.path().join("server.log");
    let args = ["--min-free-disk", "16MiB", "--checkpoint-interval", "200ms"];
    let (mut child, mut c) = start_with_queue(&[], &data, &log, &args).await;
    let mut stored = Vec::new();
    let mut refused = None;
    for round in 0..400 {
        match publish_batch(&mut c, "m", round * 8, 8, 64 << 10).await {
            Ok(ids) => stored.extend(ids),
            Err(s) => {
                refused = Some(s);
                break;
            }
        }
    }
    let refused = refused.expect("the disk filled up");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("disk"), "{}", refused.message());
    assert!(stored.len() > 50, "{} messages stored first", stored.len());
    // Still full: publishes keep failing; receives and acks work.
    let again = publish_batch(&mut c, "late", 0, 1, 10).await;
    assert_eq!(
        again.expect_err("still full").code(),
        Code::ResourceExhausted
    );
    let got = c.receive("q", 5).await;
    assert_eq!(got.len(), 5);
    let tokens: Vec<&str> = got.iter().map(|d| d.ack_token.as_str()).collect();
    assert!(c.ack(&tokens).await.iter().all(ok), "acks keep working");
    // Space returns: publishes resume by themselves.
    std::fs::remove_file(&filler).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let resumed = loop {
        if let Ok(ids) = publish_batch(&mut c, "after", 0, 1, 10).await {
            break ids;
        }
        assert!(Instant::now() < until, "publishes did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Nothing stored was lost, across a restart too.
    let acked: std::collections::BTreeSet<String> =
        got.iter().map(|d| d.message_id.clone()).collect();
    let mut want: std::collections::BTreeSet<String> = stored
        .iter()
        .filter(|id| !acked.contains(*id))
        .cloned()
        .collect();
    want.extend(resumed);
    assert_eq!(ids_in_queue(&mut c).await, want);
    term(&child);
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    assert_eq!(st.and_then(|s| s.code()), Some(0));
    assert_eq!(ids_after_restart(&data, &log, &args).await, want);
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).expect("statvfs");
    st.f_bavail * st.f_frsize
}

/// One receive of a message from `q`: the call's status.
async fn receive_one(c: &mut Clients) -> Result<Vec<pb::Delivery>, tonic::Status> {
    c.msg
        .receive(pb::ReceiveRequest {
            queue: "q".into(),
            max_messages: 1,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().deliveries)
}

/// `--min-free-disk` is honest: the log segment the server will prepare
/// next counts against it, so publishes are refused while the minimum is
/// still free; below the hard floor (a quarter of it) acks and receives
/// are refused too, and the server stays up; both resume when space
/// returns.
#[tokio::test]
async fn the_minimum_counts_the_next_segment_and_a_hard_floor_keeps_the_server_up() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let _m = match Mount::tmpfs(&mnt, "128m") {
        Ok(m) => m,
        Err(e) => return skip("free space", &format!("cannot mount a tmpfs ({e})")),
    };
    let data = mnt.join("data");
    let log = tmp.path().join("server.log");
    let args = [
        "--min-free-disk",
        "16MiB",
        "--wal-segment-size",
        "16MiB",
        "--checkpoint-interval",
        "200ms",
    ];
    let (mut child, mut c) = start_with_queue(&[], &data, &log, &args).await;
    let mut refused = None;
    for round in 0..1000 {
        if let Err(s) = publish_batch(&mut c, "m", round * 8, 8, 64 << 10).await {
            refused = Some(s);
            break;
        }
    }
    let refused = refused.expect("publishes were refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // Let the log prepare its next segment, as it does after a switch.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let free = free_bytes(&mnt);
    assert!(free >= 16 << 20, "refused only at {free} bytes free");
    // Down to below the hard floor (4 MiB): acks and receives are refused
    // too, with a clear status, and the server stays up.
    let filler = mnt.join("filler");
    let fill = usize::try_from(free - (3 << 20)).unwrap();
    std::fs::write(&filler, vec![0u8; fill]).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match receive_one(&mut c).await {
            Err(s) => break s,
            Ok(got) => {
                // Not yet noticed: give the lease back (the nack itself
                // may already be refused: the floor is what is waited for).
                for d in got {
                    let _ = c
                        .msg
                        .nack(pb::NackRequest {
                            items: vec![pb::NackItem {
                                ack_token: d.ack_token,
                                ..Default::default()
                            }],
                        })
                        .await;
                }
            }
        }
        assert!(Instant::now() < until, "receives were not refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("hard floor"),
        "{}",
        status.message()
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server is still up"
    );
    // Space returns: receives and acks, then publishes, resume.
    std::fs::remove_file(&filler).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let got = loop {
        if let Ok(got) = receive_one(&mut c).await {
            break got;
        }
        assert!(Instant::now() < until, "receives did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(ok(&c.ack(&[&got[0].ack_token]).await[0]));
    term(&child);
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    assert_eq!(st.and_then(|s| s.code()), Some(0));
}

#[tokio::test]
async fn running_out_of_space_without_headroom_is_fail_stop_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let _m = match Mount::tmpfs(&mnt, "12m") {
        Ok(m) => m,
        Err(e) => return skip("ENOSPC", &format!("cannot mount a tmpfs ({e})")),
    };
    let data = mnt.join("data");
    let log = tmp.path().join("server.log");
    // No free-space threshold: the writes themselves meet ENOSPC.
    let args = ["--min-free-disk", "0", "--checkpoint-interval", "100ms"];
    let (mut child, mut c) = start_with_queue(&[], &data, &log, &args).await;
    let mut acked = Vec::new();
    let mut failed = 0;
    for round in 0..400 {
        match publish_batch(&mut c, "m", round * 4, 4, 64 << 10).await {
            Ok(ids) => acked.extend(ids),
            Err(_) => {
                failed += 1;
                if child.try_wait().unwrap().is_some() || failed > 20 {
                    break;
                }
            }
        }
    }
    assert!(failed > 0, "the disk filled up");
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    assert_eq!(
        st.and_then(|s| s.code()),
        Some(3),
        "fail-stop exit; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // More room, and a restart: every acknowledged publish is there.
    run("mount", &["-o", "remount,size=64m"], Some(&mnt)).expect("grow the tmpfs");
    assert_none_lost(&acked, &ids_after_restart(&data, &log, &args).await);
}

#[tokio::test]
async fn a_file_system_turning_read_only_is_fail_stop_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let image = tmp.path().join("fs.img");
    let m = match Mount::ext4(&image, &mnt, 64) {
        Ok(m) => m,
        Err(e) => {
            return skip(
                "read-only",
                &format!("cannot mount a loop ext4 image ({e})"),
            );
        }
    };
    let Some(dev) = m.device() else {
        return skip("read-only", "no block device found for the mount");
    };
    let trigger = PathBuf::from(format!("/sys/fs/ext4/{dev}/trigger_fs_error"));
    if !trigger.exists() {
        return skip("read-only", &format!("{} is missing", trigger.display()));
    }
    let data = mnt.join("data");
    let log = tmp.path().join("server.log");
    let args = ["--min-free-disk", "0"];
    let (mut child, mut c) = start_with_queue(&[], &data, &log, &args).await;
    let mut acked = Vec::new();
    for round in 0..10 {
        acked.extend(
            publish_batch(&mut c, "m", round * 4, 4, 100)
                .await
                .expect("publish"),
        );
    }
    // An ext4 error: the file system goes read-only with the server's
    // files open (errors=remount-ro).
    std::fs::write(&trigger, "chaos test\n").expect("trigger an ext4 error");
    let r = publish_batch(&mut c, "late", 0, 1, 100).await;
    assert!(
        r.is_err(),
        "a publish on a read-only file system is not acknowledged"
    );
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(st.and_then(|s| s.code()), Some(3), "fail-stop exit: {text}");
    assert!(text.contains("Read-only file system"), "{text}");
    // Repair and mount again; every acknowledged publish is there.
    drop(m);
    let _ = Command::new("e2fsck").arg("-fy").arg(&image).output();
    let _m = Mount { dir: mnt.clone() };
    run(
        "mount",
        &["-o", "loop"],
        Some(&PathBuf::from(format!(
            "{} {}",
            image.display(),
            mnt.display()
        ))),
    )
    .expect("mount again");
    assert_none_lost(&acked, &ids_after_restart(&data, &log, &args).await);
}

#[tokio::test]
async fn a_failing_fdatasync_is_fail_stop_and_never_retried() {
    if Command::new("fiu-run").arg("-h").output().is_err() {
        return skip(
            "failing fdatasync",
            "fiu-run is not installed (apt-get install fiu-utils)",
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("server.log");
    let ctrl = tmp.path().join("fiu");
    let ctrl_s = ctrl.to_str().unwrap();
    let args = ["--min-free-disk", "0"];
    let (mut child, mut c) =
        start_with_queue(&["fiu-run", "-x", "-f", ctrl_s], &data, &log, &args).await;
    let acked = publish_batch(&mut c, "m", 0, 10, 100)
        .await
        .expect("publish");
    // From now on every fdatasync fails with EIO.
    let out = Command::new("fiu-ctrl")
        .args([
            "-f",
            ctrl_s,
            "-c",
            "enable name=posix/io/sync/fdatasync,failinfo=5",
        ])
        .arg(child.id().to_string())
        .output()
        .expect("fiu-ctrl");
    assert!(out.status.success(), "{out:?}");
    let r = publish_batch(&mut c, "late", 0, 1, 100).await;
    assert!(
        r.is_err(),
        "a publish whose fdatasync failed is not acknowledged"
    );
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    assert_eq!(st.and_then(|s| s.code()), Some(3), "fail-stop exit");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("fdatasync"), "{text}");
    assert_eq!(
        text.matches("no further writes are accepted").count(),
        1,
        "one failure, no retry: {text}"
    );
    // Without the fault, the next start recovers from disk.
    assert_none_lost(&acked, &ids_after_restart(&data, &log, &args).await);
}

// ---- damaged or lost data at start -------------------------------------

/// A stopped server's data directory with a queue and 300 messages, the
/// database checkpointed.
async fn stopped_dir() -> (TestServer, Vec<(PathBuf, u64)>) {
    let mut s = TestServer::start().await;
    let mut c = s.clients().await;
    c.create("q", config()).await;
    for i in 0..30 {
        publish_batch(&mut c, "m", i * 10, 10, 200).await.unwrap();
    }
    assert!(s.stop().await.success());
    let sizes = sizes(&s.data_dir());
    (s, sizes)
}

fn sizes(d: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(sizes(&p));
        } else {
            out.push((p.clone(), std::fs::metadata(&p).unwrap().len()));
        }
    }
    out.sort();
    out
}

/// Starts on a damaged directory: must refuse (exit 1) naming `needle`,
/// and neither remove nor shrink any file (but sled's snapshot).
fn assert_refused(s: &TestServer, before: &[(PathBuf, u64)], needle: &str) -> String {
    let log = s.data_dir().with_file_name("refused.log");
    let err = spawn(&s.data_dir(), &log, &[]).expect_err("the start is refused");
    assert!(err.contains("exited with exit status: 1"), "{err}");
    assert!(err.contains(needle), "{needle:?} not named in: {err}");
    let after = sizes(&s.data_dir());
    for (path, size) in before {
        // sled rewrites its page-table snapshot (`snap.<lsn>`, derived from
        // its log) whenever it opens.
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
        {
            continue;
        }
        let now = after.iter().find(|(p, _)| p == path).map(|(_, n)| *n);
        assert!(
            now.is_some_and(|n| n >= *size),
            "{} was {size} bytes, now {now:?}",
            path.display()
        );
    }
    err
}

/// Writes `contents` over the data directory's file `file`, then
/// [`assert_refused`].
fn assert_refused_after_writing(
    s: &TestServer,
    before: &[(PathBuf, u64)],
    file: &str,
    contents: &str,
    needle: &str,
) -> String {
    std::fs::write(s.data_dir().join(file), contents).unwrap();
    assert_refused(s, before, needle)
}

/// Damage to the database is either repaired from the log (when the log
/// still holds what was lost) or refused naming the database; never served
/// as less data. Returns the refusal, if any.
async fn damage_db(
    s: &mut TestServer,
    before: &[(PathBuf, u64)],
    damage: impl Fn(&Path),
) -> Option<String> {
    let db = s.data_dir().join("db").join("db");
    damage(&db);
    let db_size = std::fs::metadata(&db).unwrap().len();
    let before: Vec<(PathBuf, u64)> = before
        .iter()
        .map(|(p, n)| {
            if *p == db {
                (p.clone(), db_size)
            } else {
                (p.clone(), *n)
            }
        })
        .collect();
    let log = s.data_dir().with_file_name("damaged.log");
    match spawn(&s.data_dir(), &log, &[]) {
        Ok((mut child, addr)) => {
            let mut c = connect(addr).await;
            let mut names = Vec::new();
            for i in 0..6 {
                let q = c
                    .admin
                    .get_queue(pb::GetQueueRequest {
                        name: format!("queue-{i}"),
                    })
                    .await;
                names.push(q.is_ok());
            }
            let total = c.stats("q").await.total;
            child.kill().unwrap();
            child.wait().unwrap();
            assert_eq!(names, vec![true; 6], "every queue is there");
            assert_eq!(total, 300, "every message is there");
            None
        }
        Err(_) => Some(assert_refused(s, &before, "/db")),
    }
}

/// A stopped server's directory whose last changes (queue creations) live
/// only in the database: the log that carried them was retired at the
/// checkpoint.
async fn checkpointed_dir() -> (TestServer, Vec<(PathBuf, u64)>) {
    let (mut s, _) = stopped_dir().await;
    s.restart().await;
    let mut c = s.clients().await;
    for i in 0..6 {
        c.create(&format!("queue-{i}"), config()).await;
    }
    assert!(s.stop().await.success());
    let sizes = sizes(&s.data_dir());
    (s, sizes)
}

#[tokio::test]
async fn a_damaged_or_truncated_database_is_repaired_from_the_log_or_refused() {
    let mut refusals = 0;
    for (name, garbage_from, keep) in [
        ("garbage over the second half", 2u64, 0u64),
        ("garbage over three quarters", 4, 0),
        ("64 flipped bytes in the middle", 0, 0),
        ("truncated to a half", 0, 2),
        ("truncated to a quarter", 0, 4),
        ("truncated to a sixth", 0, 6),
        ("truncated to a twentieth", 0, 20),
    ] {
        let (mut s, before) = checkpointed_dir().await;
        let refused = damage_db(&mut s, &before, |db| {
            let mut bytes = std::fs::read(db).unwrap();
            let len = bytes.len();
            if keep > 0 {
                bytes.truncate(len / usize::try_from(keep).unwrap());
            } else if garbage_from > 0 {
                let from = len / usize::try_from(garbage_from).unwrap();
                for b in &mut bytes[from..] {
                    *b = 0xa5;
                }
            } else {
                for b in &mut bytes[len / 2..len / 2 + 64] {
                    *b ^= 0xff;
                }
            }
            std::fs::write(db, &bytes).unwrap();
        })
        .await;
        eprintln!(
            "{name}: {}",
            refused.as_deref().unwrap_or("repaired from the log")
        );
        refusals += usize::from(refused.is_some());
    }
    assert!(refusals > 0, "some damage is beyond repair and refused");
}

#[tokio::test]
async fn a_database_older_than_its_last_checkpoint_is_refused() {
    // What a database that lost records whose log was already retired
    // looks like: the CHECKPOINT record is ahead of what the database and
    // the log hold together.
    let (s, before) = checkpointed_dir().await;
    // The applied lsn raised; the log position kept as it was.
    let text = std::fs::read_to_string(s.data_dir().join("CHECKPOINT")).unwrap();
    let log: String = text.lines().skip(2).map(|l| format!("{l}\n")).collect();
    let err = assert_refused_after_writing(
        &s,
        &before,
        "CHECKPOINT",
        &format!("letterbox checkpoint\napplied 10000000\n{log}"),
        "/db",
    );
    assert!(err.contains("damaged or truncated"), "{err}");
}

#[tokio::test]
async fn a_missing_database_is_refused_rather_than_started_empty() {
    let (s, before) = stopped_dir().await;
    std::fs::remove_dir_all(s.data_dir().join("db")).unwrap();
    let before: Vec<(PathBuf, u64)> = before
        .into_iter()
        .filter(|(p, _)| !p.starts_with(s.data_dir().join("db")))
        .collect();
    let err = assert_refused(&s, &before, "/db");
    assert!(err.contains("refusing to start empty"), "{err}");
}

#[tokio::test]
async fn a_truncated_log_segment_holding_payloads_is_refused() {
    let (s, before) = stopped_dir().await;
    let wal = s.data_dir().join("wal");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segs.sort();
    // The payloads are in the oldest segment.
    let seg = &segs[0];
    std::fs::OpenOptions::new()
        .write(true)
        .open(seg)
        .unwrap()
        .set_len(100)
        .unwrap();
    let before: Vec<(PathBuf, u64)> = before
        .into_iter()
        .map(|(p, n)| if &p == seg { (p, 100) } else { (p, n) })
        .collect();
    let err = assert_refused(&s, &before, &seg.file_name().unwrap().to_string_lossy());
    assert!(
        err.contains("truncated") || err.contains("damaged"),
        "{err}"
    );
}

#[tokio::test]
async fn a_stale_format_is_refused_and_nothing_is_touched() {
    let (s, before) = stopped_dir().await;
    let err = assert_refused_after_writing(
        &s,
        &before,
        "FORMAT",
        "letterbox data directory\nformat 0\n",
        "FORMAT",
    );
    assert!(err.contains("format 0"), "{err}");
}

/// What a power cut during the very first start can leave: the format
/// file made durable, the log directory empty, and the database's files
/// created by sled but never written.
fn first_start_cut_short(data: &Path) {
    std::fs::create_dir_all(data.join("wal")).unwrap();
    std::fs::create_dir_all(data.join("db")).unwrap();
    std::fs::write(data.join("FORMAT"), "letterbox data directory\nformat 1\n").unwrap();
    std::fs::write(data.join("LOCK"), "").unwrap();
    std::fs::write(data.join("db").join("conf"), "").unwrap();
    std::fs::write(data.join("db").join("db"), "").unwrap();
}

#[tokio::test]
async fn a_first_start_cut_short_is_initialized_again_and_then_keeps_what_it_acknowledges() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let log = tmp.path().join("server.log");
    first_start_cut_short(&data);
    // `letterbox verify` says what the next start does, and finds nothing
    // wrong.
    let out = Command::new(env!("CARGO_BIN_EXE_letterbox"))
        .args(["verify", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("first start of this directory was cut short"),
        "{text}"
    );

    let (mut child, mut c) = start_with_queue(&[], &data, &log, &[]).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("initializing it again"),
        "the start says what it did: {logged}"
    );
    let acked = publish_batch(&mut c, "m", 0, 20, 100).await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // Past its first start, the directory is an ordinary one: what it
    // acknowledged survives a kill, and a lost database is refused again.
    let have = ids_after_restart(&data, &log, &[]).await;
    assert_none_lost(&acked, &have);
    assert!(data.join("CHECKPOINT").exists());
    std::fs::remove_dir_all(data.join("db")).unwrap();
    let err = start(&[], &data, &log, &[]).expect_err("refused");
    assert!(err.contains("refusing to start empty"), "{err}");
}

#[tokio::test]
async fn a_missing_database_is_refused_even_without_the_checkpoint_record_while_the_log_has_segments()
 {
    let (s, before) = stopped_dir().await;
    std::fs::remove_dir_all(s.data_dir().join("db")).unwrap();
    std::fs::remove_file(s.data_dir().join("CHECKPOINT")).unwrap();
    let before: Vec<(PathBuf, u64)> = before
        .into_iter()
        .filter(|(p, _)| !p.starts_with(s.data_dir().join("db")) && !p.ends_with("CHECKPOINT"))
        .collect();
    let err = assert_refused(&s, &before, "/db");
    assert!(err.contains("refusing to start empty"), "{err}");
}

/// A file system too small for the log's settings (64 MiB segments and a
/// 64 MiB minimum keep 192 MiB from messages) is refused at start, with
/// settings that fit; with those, messages fill most of it.
#[tokio::test]
async fn a_file_system_too_small_for_the_settings_is_refused_with_settings_that_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let _m = match Mount::tmpfs(&mnt, "200m") {
        Ok(m) => m,
        Err(e) => return skip("small disk", &format!("cannot mount a tmpfs ({e})")),
    };
    let data = mnt.join("data");
    let log = tmp.path().join("server.log");
    let defaults = ["--wal-segment-size", "64MiB", "--min-free-disk", "64MiB"];
    let err = start(&[], &data, &log, &defaults).expect_err("refused");
    assert!(
        err.contains("too small for these settings")
            && err.contains("--wal-segment-size 4MiB --min-free-disk 8MiB"),
        "{err}"
    );
    let fitting = ["--wal-segment-size", "4MiB", "--min-free-disk", "8MiB"];
    let (mut child, mut c) = start_with_queue(&[], &data, &log, &fitting).await;
    let body = "m".repeat(1 << 20);
    for _ in 0..100 {
        c.publish("q", &[&body]).await;
    }
    assert_eq!(c.stats("q").await.ready, 100);
    term(&child);
    let st = wait_exit(&mut child, Duration::from_secs(30)).await;
    assert_eq!(st.and_then(|s| s.code()), Some(0));
}
