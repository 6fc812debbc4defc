//! A PostgreSQL server of its own for a test, started in a temporary
//! directory on a loopback port (as the `postgres` user when run as root:
//! PostgreSQL refuses to run as root). Without PostgreSQL's programs
//! (Debian's `postgresql` package) [`LocalPg::start`] says to skip,
//! unless LETTERBOX_REQUIRE_ECOSYSTEM=1, when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A PostgreSQL server of its own, stopped (immediately) on drop.
pub(crate) struct LocalPg {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    owner: Option<(u32, u32)>,
    _dir: tempfile::TempDir,
}

fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

/// The uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl LocalPg {
    pub(crate) fn start(test: &str) -> Option<LocalPg> {
        let Some(bin) = pg_bin() else {
            let why =
                "no PostgreSQL programs under /usr/lib/postgresql (apt-get install postgresql)";
            assert!(
                std::env::var("LETTERBOX_REQUIRE_ECOSYSTEM").as_deref() != Ok("1"),
                "{test}: {why}"
            );
            eprintln!("SKIP {test}: {why}");
            return None;
        };
        let root = rustix::process::geteuid().is_root();
        let owner = if root {
            Some(postgres_user().expect("running as root needs the postgres user"))
        } else {
            None
        };
        let dir = tempfile::tempdir().expect("tempdir");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let data = dir.path().join("data");
        let pg = LocalPg {
            bin,
            data,
            port: free_port(),
            owner,
            _dir: dir,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data.display().to_string(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=20",
            pg.port,
            pg._dir.path().display()
        );
        pg.run(
            "pg_ctl",
            &[
                "-D",
                &pg.data.display().to_string(),
                "-o",
                &opts,
                "-l",
                &pg._dir.path().join("log").display().to_string(),
                "-w",
                "start",
            ],
        );
        Some(pg)
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match self.owner {
            Some(_) => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .current_dir(self._dir.path())
            .output()
            .expect("run a PostgreSQL program");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }
}

impl Drop for LocalPg {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ])
            .current_dir(self.dir())
            .output();
    }
}

/// The pid of the session running a statement that starts with `sql`,
/// once it waits for `event` (or fails after 20 s).
pub(crate) async fn session_waiting(c: &tokio_postgres::Client, sql: &str, event: &str) -> i32 {
    for _ in 0..400 {
        let row = c
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                 WHERE wait_event = $1 AND starts_with(query, $2) LIMIT 1",
                &[&event, &sql],
            )
            .await
            .expect("pg_stat_activity");
        if let Some(row) = row {
            return row.get(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no session ran {sql:?} waiting for {event}");
}

/// Sets `synchronous_standby_names` and reloads the configuration.
pub(crate) async fn set_sync_standby(c: &tokio_postgres::Client, url: &str, names: &str) {
    c.batch_execute(&format!(
        "ALTER SYSTEM SET synchronous_standby_names = {names}"
    ))
    .await
    .expect("alter system");
    c.batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    // Sessions take the new value at their next statement, once the
    // postmaster has passed the signal on: wait until a fresh one sees it.
    let want = names.trim_matches('\'');
    for _ in 0..400 {
        let (fresh, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let now: String = fresh
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .expect("show")
            .get(0);
        if now == want {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("synchronous_standby_names never became {names}");
}
