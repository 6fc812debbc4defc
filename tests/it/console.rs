//! The web console in a real browser: tests/console/run.sh starts servers
//! with `--console-listen` and drives Debian's chromium through
//! chromedriver (selenium, from PyPI) over the overview, the dead-letter
//! page and its redrive, the purge confirmation, the depth plot, and the
//! login, permissions and CSRF check with principals, checking each page's
//! effect over gRPC. Without chromium and chromium-driver, python3 or PyPI
//! it skips (`skip_or_run`; .ci/run installs the packages and makes a skip
//! fail). Its screenshots go to target/console-screenshots/.

#[test]
fn the_console_works_in_a_browser() {
    let Some(text) = crate::ecosystem::skip_or_run(
        "the_console_works_in_a_browser",
        "tests/console/run.sh",
        &[],
        &[],
    ) else {
        return;
    };
    assert!(
        text.contains("PASS: the console in a browser against a real server"),
        "{text}"
    );
}
