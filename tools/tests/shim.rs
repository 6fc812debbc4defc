//! The durable mirror of the LD_PRELOAD library: after a process is
//! killed, the rebuilt tree holds exactly what was made durable (fsync or
//! fdatasync of a file for its data, fsync of a directory for its
//! entries), and kill points fire at the n-th call of their class.
//!
//! A small C program does the file-system calls (so that they go through
//! the C library, as the server's do) and kills itself.

use std::path::{Path, PathBuf};
use std::process::Command;

use letterbox_tools::chaos::shim;

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *path, const char *text, int sync) {
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    write(fd, text, strlen(text));
    if (sync) fsync(fd);
    close(fd);
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    fsync(fd);
    close(fd);
}

int main(int argc, char **argv) {
    const char *r = argv[2];
    char p[4096], q[4096];
    if (strcmp(argv[1], "basic") == 0) {
        snprintf(p, sizeof p, "%s/a", r); put(p, "hello", 1);
        sync_dir(r);
        snprintf(p, sizeof p, "%s/b", r); put(p, "bbb", 1);       /* entry never synced */
        snprintf(p, sizeof p, "%s/old", r);
        int fd = open(p, O_WRONLY | O_APPEND); write(fd, "-more", 5); close(fd);
        snprintf(p, sizeof p, "%s/old2", r);
        fd = open(p, O_RDWR); pwrite(fd, "XY", 2, 1); fdatasync(fd); close(fd);
        snprintf(p, sizeof p, "%s/a", r); snprintf(q, sizeof q, "%s/c", r);
        rename(p, q);                                            /* not synced */
        snprintf(p, sizeof p, "%s/sub", r); mkdir(p, 0755);
        snprintf(q, sizeof q, "%s/sub/x", r); put(q, "x", 1);
        sync_dir(p);                                             /* sub's parent never synced */
    } else if (strcmp(argv[1], "rename") == 0) {
        snprintf(p, sizeof p, "%s/f.tmp", r); put(p, "new", 1);
        snprintf(q, sizeof q, "%s/f", r); rename(p, q);
        sync_dir(r);
        snprintf(p, sizeof p, "%s/old", r); unlink(p);             /* not synced */
        snprintf(p, sizeof p, "%s/old2", r); ftruncate(open(p, O_RDWR), 2);   /* not synced */
    } else if (strcmp(argv[1], "sfr") == 0) {
        snprintf(p, sizeof p, "%s/old2", r);
        int fd = open(p, O_RDWR);
        pwrite(fd, "ZZ", 2, 0);
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    } else if (strcmp(argv[1], "torn") == 0) {
        /* 8 pages of 'n' over the 8 pages of 'o' in big, never synced */
        snprintf(p, sizeof p, "%s/big", r);
        int fd = open(p, O_RDWR);
        char page[4096];
        memset(page, 'n', sizeof page);
        for (int i = 0; i < 8; i++) pwrite(fd, page, sizeof page, (off_t)i * 4096);
    } else if (strcmp(argv[1], "killpoint") == 0) {
        snprintf(p, sizeof p, "%s/old", r);
        int fd = open(p, O_WRONLY | O_APPEND);
        for (int i = 1; i <= 3; i++) {
            char line[8];
            snprintf(line, sizeof line, "|%d", i);
            write(fd, line, strlen(line));
            fsync(fd);                                           /* killed at the 2nd */
        }
    }
    kill(getpid(), SIGKILL);
    return 0;
}
"#;

struct Fixture {
    dir: tempfile::TempDir,
    lib: PathBuf,
    prog: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = shim::build(dir.path()).expect("the library compiles");
    let src = dir.path().join("prog.c");
    std::fs::write(&src, PROGRAM).expect("write program");
    let prog = dir.path().join("prog");
    let st = Command::new("cc")
        .arg("-o")
        .arg(&prog)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "the test program compiles");
    Fixture { dir, lib, prog }
}

impl Fixture {
    /// Runs a scenario on a fresh root holding `old` ("orig") and `old2`
    /// ("abcdef"); returns the tree a power cut leaves.
    fn run(&self, scenario: &str, env: &[(&str, &str)]) -> PathBuf {
        let base = self.dir.path().join(scenario);
        let root = base.join("root");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::write(root.join("old"), "orig").expect("old");
        std::fs::write(root.join("old2"), "abcdef").expect("old2");
        std::fs::write(root.join("big"), vec![b'o'; 8 * 4096]).expect("big");
        let mirror = base.join("mirror");
        let status = Command::new(&self.prog)
            .arg(scenario)
            .arg(&root)
            .env("LD_PRELOAD", &self.lib)
            .env("LBSHIM_ROOT", &root)
            .env("LBSHIM_MIRROR", &mirror)
            .envs(env.iter().copied())
            .status()
            .expect("run");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the program killed itself");
        let out = base.join("after");
        if env.iter().any(|(k, v)| *k == "LBSHIM_MODE" && *v == "torn") {
            let mut rng = fastrand::Rng::with_seed(7);
            let (_, pages) =
                shim::materialize_torn(&mirror, &out, &root, &mut rng).expect("materialize");
            std::fs::write(base.join("torn-pages"), pages.to_string()).expect("write");
        } else {
            shim::materialize(&mirror, &out).expect("materialize");
        }
        out
    }
}

fn listing(dir: &Path) -> Vec<(String, String)> {
    listing_with(dir, &["big"])
}

fn listing_with(dir: &Path, skip: &[&str]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if skip.contains(&name.as_str()) {
                return (name, String::new());
            }
            let content = if e.path().is_dir() {
                format!("dir {:?}", listing(&e.path()))
            } else {
                std::fs::read_to_string(e.path()).expect("read")
            };
            (name, content)
        })
        .collect();
    v.sort();
    v
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    v.push(("big".into(), String::new()));
    v.sort();
    v
}

#[test]
fn only_what_was_synced_survives() {
    let f = fixture();
    let after = f.run("basic", &[]);
    assert_eq!(
        listing(&after),
        pairs(&[
            // created, written, fsynced, directory fsynced
            ("a", "hello"),
            // appended without fsync: as before
            ("old", "orig"),
            // pwrite + fdatasync
            ("old2", "aXYdef"),
        ]),
        "b (entry never synced), c (rename not synced) and sub (its parent not synced) are gone"
    );
}

#[test]
fn renames_unlinks_and_truncations_need_their_sync() {
    let f = fixture();
    let after = f.run("rename", &[]);
    assert_eq!(
        listing(&after),
        pairs(&[("f", "new"), ("old", "orig"), ("old2", "abcdef")])
    );
}

#[test]
fn sync_file_range_counts_only_in_lenient_mode() {
    let f = fixture();
    let strict = f.run("sfr", &[]);
    assert_eq!(
        std::fs::read_to_string(strict.join("old2")).expect("read"),
        "abcdef"
    );
    let lenient = f.run("sfr", &[("LBSHIM_MODE", "lenient")]);
    assert_eq!(
        std::fs::read_to_string(lenient.join("old2")).expect("read"),
        "ZZcdef"
    );
}

#[test]
fn a_kill_point_fires_before_the_nth_call() {
    let f = fixture();
    let mark = f.dir.path().join("mark");
    let after = f.run(
        "killpoint",
        &[
            ("LBSHIM_KILL", "fsync:2:0"),
            ("LBSHIM_MARK", mark.to_str().expect("utf8")),
        ],
    );
    // The first fsync made "|1" durable; the process died before the
    // second.
    assert_eq!(
        std::fs::read_to_string(after.join("old")).expect("read"),
        "orig|1"
    );
    assert_eq!(
        std::fs::read_to_string(&mark).expect("mark").trim(),
        "fsync 2"
    );
}

#[test]
fn torn_mode_lets_some_unsynced_pages_through_and_nothing_else() {
    let f = fixture();
    let after = f.run("torn", &[("LBSHIM_MODE", "torn")]);
    let big = std::fs::read(after.join("big")).expect("read");
    assert_eq!(big.len(), 8 * 4096);
    let mut new_pages = 0;
    for page in big.chunks(4096) {
        // Each page is wholly the old or wholly the new content.
        assert!(
            page.iter().all(|&b| b == b'o') || page.iter().all(|&b| b == b'n'),
            "a page mixes old and new data"
        );
        new_pages += usize::from(page[0] == b'n');
    }
    let reported: usize = std::fs::read_to_string(f.dir.path().join("torn/torn-pages"))
        .expect("pages")
        .parse()
        .expect("number");
    assert_eq!(new_pages, reported);
    assert!(
        (1..8).contains(&new_pages),
        "some pages but not all (seeded): {new_pages}"
    );
    // Strict mode: none.
    let strict = f.run("torn", &[]);
    assert!(
        std::fs::read(strict.join("big"))
            .expect("read")
            .iter()
            .all(|&b| b == b'o')
    );
}

#[test]
fn a_mirror_whose_root_record_is_cut_short_is_refused_rather_than_rebuilt_empty() {
    let f = fixture();
    let after = f.run("basic", &[]);
    let mirror = f.dir.path().join("basic").join("mirror");
    assert!(!mirror.join("root.tmp").exists(), "renamed into place");
    let whole = std::fs::read_to_string(mirror.join("root")).expect("root");
    for cut in ["", &whole[..whole.len() / 2]] {
        std::fs::write(mirror.join("root"), cut).expect("write");
        let err = shim::materialize(&mirror, &after).expect_err("refused");
        assert!(err.to_string().contains("malformed mirror root"), "{err}");
        assert!(after.join("old").exists(), "the tree is left alone");
    }
}
