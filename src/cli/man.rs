//! `letterbox man`: the manual pages, generated from the clap definitions
//! (clap_mangen: name, synopsis, description, options, subcommands) with
//! the sections a manual page has besides: EXAMPLES, EXIT STATUS, FILES
//! and SEE ALSO, written here for each command.

use std::io::Write as _;
use std::path::Path;

use clap_mangen::Man;

/// The kind of a command, which decides its exit status and files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `letterbox` itself.
    Top,
    /// `serve`.
    Serve,
    /// `verify`.
    Verify,
    /// A command that talks to a server.
    Client,
    /// `health`: asks a server whether it serves.
    Health,
    /// `context`: profiles, no server.
    Context,
    /// `tls`: certificates, no server.
    Tls,
    /// `auth`, `completions`, `man`: local, no files.
    Local,
}

/// The top-level subcommand a page's command belongs to (`queue` for
/// `letterbox-queue-create`), `None` for `letterbox` itself.
fn group_of(display: &str) -> Option<&str> {
    display
        .strip_prefix("letterbox-")
        .map(|rest| rest.split('-').next().unwrap_or(rest))
}

fn kind_of(group: Option<&str>) -> Kind {
    match group {
        None => Kind::Top,
        Some("serve") => Kind::Serve,
        Some("verify") => Kind::Verify,
        Some("context") => Kind::Context,
        Some("tls") => Kind::Tls,
        Some("health") => Kind::Health,
        Some("auth" | "completions" | "man") => Kind::Local,
        Some(_) => Kind::Client,
    }
}

/// Examples, each a comment and a command line.
fn examples(group: Option<&str>) -> &'static [(&'static str, &'static str)] {
    match group {
        None => &[
            (
                "Run the server (data in ./letterbox-data, gRPC on 127.0.0.1:50051):",
                "letterbox serve",
            ),
            (
                "A queue with a dead letter queue, a message, a consumer that fails:",
                "letterbox queue create orders.dlq\nletterbox queue create orders --dlq orders.dlq --max-deliveries 3\nletterbox publish orders '{\"order\":1}'\nletterbox consume orders --nack --reason \"payment service down\"",
            ),
            (
                "The connection flags before the subcommand, as after it:",
                "letterbox --context prod queue list",
            ),
        ],
        Some("serve") => &[
            (
                "With the packaged configuration file:",
                "letterbox serve --config /etc/letterbox/letterbox.toml",
            ),
            (
                "Over TLS with certificates made by letterbox tls init, metrics on:",
                "letterbox serve --tls-cert tls/server.pem --tls-key tls/server.key --metrics-listen 127.0.0.1:9464",
            ),
            (
                "One node of a highly available pair, its state in PostgreSQL:",
                "letterbox serve --listen 0.0.0.0:50051 --node-name a --standby --store postgres://letterbox@db/letterbox",
            ),
        ],
        Some("verify") => &[(
            "Check the data directory of a stopped server:",
            "letterbox verify --data-dir /var/lib/letterbox/data",
        )],
        Some("queue") => &[
            (
                "A queue whose messages move to a dead letter queue after 3 deliveries:",
                "letterbox queue create orders.dlq\nletterbox queue create orders --dlq orders.dlq --max-deliveries 3 --ttl 7d",
            ),
            (
                "Its figures, and every queue with its depth:",
                "letterbox queue stats orders\nletterbox queue list",
            ),
            (
                "Change its lease length:",
                "letterbox queue update orders --ack-timeout 5m",
            ),
        ],
        Some("publish") => &[
            (
                "Two messages with a property:",
                "letterbox publish orders '{\"order\":1}' '{\"order\":2}' -p source=web",
            ),
            (
                "Each line of a file:",
                "letterbox publish orders --file orders.txt",
            ),
        ],
        Some("consume") => &[
            (
                "Receive, print and ack until the queue is empty:",
                "letterbox consume orders",
            ),
            (
                "Fail 10 messages with a reason:",
                "letterbox consume orders --nack --reason \"tax down\" --count 10",
            ),
        ],
        Some("browse") => &[(
            "Read a dead letter queue without consuming it:",
            "letterbox browse orders.dlq",
        )],
        Some("group") => &[
            (
                "The groups of a FIFO queue:",
                "letterbox group list payments",
            ),
            (
                "Release a parked group:",
                "letterbox group release payments customer-42",
            ),
        ],
        Some("exchange") => &[(
            "A fanout exchange bound to a queue with a filter:",
            "letterbox exchange create events\nletterbox exchange bind events audit --filter kind=order",
        )],
        Some("dlq") => &[
            (
                "What a redrive would move:",
                "letterbox dlq redrive orders.dlq --dry-run",
            ),
            (
                "Move the last hour's dead letters back, 100 a second:",
                "letterbox dlq redrive orders.dlq --since -1h --rate 100",
            ),
        ],
        Some("definitions") => &[(
            "Copy queues, exchanges and bindings from one server to another:",
            "letterbox definitions export --server http://a:50051 > defs.json\nletterbox definitions import defs.json --server http://b:50051",
        )],
        Some("context") => &[(
            "Save a server with its CA and a token, then use it:",
            "letterbox context add prod --server https://mq.example:50051 --ca-cert ca.pem --token TOKEN\nletterbox --context prod queue list",
        )],
        Some("tls") => &[(
            "A CA, a server certificate for mq.example and a client certificate:",
            "letterbox tls init /etc/letterbox/tls --name mq.example --client ops",
        )],
        Some("auth") => &[
            ("A token for a principal:", "letterbox auth new-token"),
            (
                "The hash of a client secret:",
                "echo -n 's3cret' | letterbox auth hash-secret",
            ),
        ],
        Some("health") => &[
            (
                "Is the server on this machine serving (exit 0), shutting down (1), down (3)?",
                "letterbox health",
            ),
            (
                "As a container's or a load balancer's check, over TLS:",
                "letterbox health --server https://mq.example:50051 --ca-cert ca.pem --json",
            ),
        ],
        Some("completions") => &[(
            "Completions for this bash session:",
            "source <(letterbox completions bash)",
        )],
        Some("man") => &[(
            "Every page into a directory:",
            "letterbox man --out-dir /usr/local/share/man/man1",
        )],
        Some(_) => &[],
    }
}

/// The EXIT STATUS section's entries.
fn exit_status(kind: Kind) -> &'static [(&'static str, &'static str)] {
    match kind {
        Kind::Top => &[
            ("0", "success"),
            ("1", "the command failed (see each command's page)"),
            ("2", "bad usage: a flag, a value, an address"),
            (
                "3",
                "serve: the storage failed while running; client commands: the server could not be reached",
            ),
        ],
        Kind::Serve => &[
            ("0", "stopped gracefully (SIGTERM or SIGINT)"),
            (
                "1",
                "cannot start: the data directory is locked, damaged or of an unknown format, the address is in use",
            ),
            ("2", "bad flags or configuration"),
            (
                "3",
                "the storage failed while running (fail-stop); a restart recovers from disk",
            ),
        ],
        Kind::Verify => &[
            ("0", "sound: no damage or inconsistency found"),
            ("1", "damage found (listed)"),
            (
                "2",
                "cannot check: not a data directory, unknown format, in use by a server",
            ),
        ],
        Kind::Client => &[
            ("0", "success"),
            (
                "1",
                "the server refused the request (the error names the status)",
            ),
            (
                "2",
                "bad usage: a flag, a value out of range, an address without a scheme",
            ),
            ("3", "the server could not be reached"),
        ],
        Kind::Health => &[
            ("0", "the server answers SERVING"),
            (
                "1",
                "it answers otherwise (shutting down), or does not know the service asked about",
            ),
            ("2", "bad usage"),
            ("3", "the server could not be reached"),
        ],
        Kind::Context | Kind::Tls | Kind::Local => &[
            ("0", "success"),
            ("1", "failure (a file that cannot be written or read)"),
            ("2", "bad usage"),
        ],
    }
}

/// The FILES section's entries.
fn files(kind: Kind) -> &'static [(&'static str, &'static str)] {
    const PROFILES: (&str, &str) = (
        "~/.config/letterbox/contexts/NAME.json",
        "connection profiles (mode 0600); $LETTERBOX_CONFIG_HOME or $XDG_CONFIG_HOME move them; current names the selected one",
    );
    match kind {
        Kind::Top => &[
            (
                "/etc/letterbox/letterbox.toml",
                "the packaged server's configuration (serve --config)",
            ),
            ("letterbox-data/", "the data directory (serve --data-dir)"),
            PROFILES,
        ],
        Kind::Serve => &[
            (
                "/etc/letterbox/letterbox.toml",
                "the configuration file of the packaged service (--config); keys are the flags' names with _",
            ),
            (
                "DATA/FORMAT, DATA/CHECKPOINT",
                "the data directory's format and its last checkpoint",
            ),
            ("DATA/LOCK", "locked by the running server"),
            ("DATA/wal/", "the write-ahead log"),
            ("DATA/db/, DATA/db-N/", "the embedded database"),
        ],
        Kind::Verify => &[(
            "DATA/",
            "the data directory checked; nothing in it is modified",
        )],
        Kind::Client | Kind::Health | Kind::Context => &[PROFILES],
        Kind::Tls => &[
            (
                "DIR/ca.pem, DIR/ca.key",
                "the CA's certificate (clients: --ca-cert) and its key (mode 0600)",
            ),
            (
                "DIR/server.pem, DIR/server.key",
                "the server's certificate and key (serve --tls-cert, --tls-key)",
            ),
            (
                "DIR/client.pem, DIR/client.key",
                "with --client: a client certificate and its key (--client-cert, --client-key)",
            ),
        ],
        Kind::Local => &[],
    }
}

/// The pages worth reading next.
fn see_also(display: &str, group: Option<&str>, subcommands: &[String]) -> Vec<String> {
    let mut pages: Vec<String> = Vec::new();
    if display != "letterbox" {
        pages.push("letterbox(1)".into());
    }
    // The page of the group above a sub-subcommand.
    if let Some(g) = group {
        let parent = format!("letterbox-{g}");
        if parent != display {
            pages.push(format!("{parent}(1)"));
        }
    }
    pages.extend(subcommands.iter().map(|s| format!("{s}(1)")));
    let related: &[&str] = match group {
        Some("serve") => &["letterbox-verify", "letterbox-tls", "letterbox-auth"],
        Some("verify") => &["letterbox-serve"],
        Some("tls") => &["letterbox-serve", "letterbox-context"],
        Some("context") => &["letterbox-tls"],
        Some("queue") => &["letterbox-publish", "letterbox-consume", "letterbox-dlq"],
        Some("publish" | "consume" | "browse") => &["letterbox-queue", "letterbox-dlq"],
        Some("dlq") => &["letterbox-browse", "letterbox-queue"],
        Some("auth") => &["letterbox-serve"],
        Some("health") => &["letterbox-serve"],
        _ => &[],
    };
    pages.extend(
        related
            .iter()
            .filter(|p| **p != display)
            .map(|p| format!("{p}(1)")),
    );
    pages
}

/// Roff text: backslashes and hyphens escaped, and a line that would
/// start with a control character made plain.
fn roff(text: &str) -> String {
    text.lines()
        .map(|line| {
            let escaped = line.replace('\\', "\\e").replace('-', "\\-");
            if escaped.starts_with('.') || escaped.starts_with('\'') {
                format!("\\&{escaped}")
            } else {
                escaped
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sections written here, in roff.
fn extra_sections(cmd: &clap::Command) -> String {
    let display = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string();
    let group = group_of(&display);
    let kind = kind_of(group);
    let mut out = String::new();
    let examples = examples(group);
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for (what, lines) in examples {
            out.push_str(&format!(
                ".PP\n{}\n.PP\n.nf\n.RS 4\n{}\n.RE\n.fi\n",
                roff(what),
                roff(lines)
            ));
        }
    }
    out.push_str(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in exit_status(kind) {
        out.push_str(&format!(".TP\n\\fB{code}\\fR\n{}\n", roff(meaning)));
    }
    let files = files(kind);
    if !files.is_empty() {
        out.push_str(".SH FILES\n");
        for (path, what) in files {
            out.push_str(&format!(".TP\n\\fI{}\\fR\n{}\n", roff(path), roff(what)));
        }
    }
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| {
            s.get_display_name()
                .map_or_else(|| format!("{display}-{}", s.get_name()), str::to_string)
        })
        .collect();
    out.push_str(".SH \"SEE ALSO\"\n");
    let pages = see_also(&display, group, &subcommands);
    let mut refs: Vec<String> = pages
        .iter()
        .filter_map(|p| p.strip_suffix("(1)"))
        .map(|p| format!("\\fB{}\\fR(1)", roff(p)))
        .collect();
    refs.push("the README, ARCHITECTURE.md and docs/ of the source (/usr/share/doc/letterbox/README.md in the package)".into());
    out.push_str(&refs.join(",\n"));
    out.push('\n');
    out
}

/// One page: clap_mangen's sections, then [`extra_sections`].
fn page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let display = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
    let man = Man::new(cmd.clone()).title(display);
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    if cmd.get_after_help().is_some() || cmd.get_after_long_help().is_some() {
        man.render_extra_section(&mut out)?;
    }
    out.write_all(extra_sections(cmd).as_bytes())?;
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// The command as the pages describe it: built, so that every subcommand
/// has its display name (`letterbox-queue-create`), without the `help`
/// subcommands.
fn built(cmd: clap::Command) -> clap::Command {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The page of `letterbox` itself.
pub fn render(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    page(&built(cmd))
}

/// Writes one page per command into `dir` (`letterbox.1`,
/// `letterbox-serve.1`, `letterbox-queue-create.1`, ...).
pub fn write_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    fn write(cmd: &clap::Command, dir: &Path) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub, dir)?;
        }
        let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name());
        std::fs::write(dir.join(format!("{name}.1")), page(cmd)?)
    }
    std::fs::create_dir_all(dir)?;
    write(&built(cmd), dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_text_is_escaped() {
        assert_eq!(roff("--ttl 7d"), "\\-\\-ttl 7d");
        assert_eq!(roff(".hidden\n'quote"), "\\&.hidden\n\\&'quote");
        assert_eq!(roff("a\\b"), "a\\eb");
    }

    #[test]
    fn pages_belong_to_their_group() {
        assert_eq!(group_of("letterbox"), None);
        assert_eq!(group_of("letterbox-queue-create"), Some("queue"));
        assert_eq!(kind_of(Some("serve")), Kind::Serve);
        assert_eq!(kind_of(Some("dlq")), Kind::Client);
    }
}
