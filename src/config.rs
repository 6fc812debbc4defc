//! Server configuration from flags, `LETTERBOX_*` environment variables
//! and a TOML file (`--config`): a flag wins over its variable, which wins
//! over the file, which wins over the default. The whole configuration is
//! validated before anything starts; errors name the flag or the file's
//! key.
//!
//! The file's keys are the flags' names with `_` for `-`
//! (`max_message_size = "10MiB"`, `listen = "0.0.0.0:50051"`), plus
//! `[[principals]]` tables (see `crate::auth::PrincipalConfig`), which
//! only the file can give.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};

use crate::auth::{Authenticator, PrincipalConfig};
use crate::server::{Limits, RemoteStore, ServerConfig, TlsConfig};
pub use crate::units::{ByteSize, Millis};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `letterbox serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Data directory (created if missing, mode 0700).
    #[arg(long, env = "LETTERBOX_DATA_DIR", default_value = "letterbox-data")]
    pub data_dir: PathBuf,
    /// Address for gRPC; port 0 picks a free port (the bound address is
    /// printed on the first line of standard output).
    #[arg(long, env = "LETTERBOX_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Largest message body.
    #[arg(long, env = "LETTERBOX_MAX_MESSAGE_SIZE", default_value = "10MiB")]
    pub max_message_size: ByteSize,
    /// Most body bytes one Receive answer carries (at least one message).
    #[arg(long, env = "LETTERBOX_MAX_RESPONSE_SIZE", default_value = "4MiB")]
    pub max_response_size: ByteSize,
    /// Log filter (tracing env-filter syntax), e.g. `info` or
    /// `letterbox=debug`.
    #[arg(long, env = "LETTERBOX_LOG", default_value = "info")]
    pub log: String,
    /// Log format.
    #[arg(long, env = "LETTERBOX_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Size of a write-ahead log segment.
    #[arg(long, env = "LETTERBOX_WAL_SEGMENT_SIZE", default_value = "64MiB")]
    pub wal_segment_size: ByteSize,
    /// Below this much free disk space, publishes are refused with
    /// RESOURCE_EXHAUSTED (acks and receives go on).
    #[arg(long, env = "LETTERBOX_MIN_FREE_DISK", default_value = "64MiB")]
    pub min_free_disk: ByteSize,
    /// Longest time between checkpoints.
    #[arg(long, env = "LETTERBOX_CHECKPOINT_INTERVAL", default_value = "30s")]
    pub checkpoint_interval: Millis,
    /// How often durable changes are copied from the log into the
    /// database (shorter: smaller, steadier batches; longer: more messages
    /// acked before they ever reach it).
    #[arg(long, env = "LETTERBOX_APPLY_INTERVAL", default_value = "500ms")]
    pub apply_interval: Millis,
    /// Most bytes of durable changes held in memory until they are
    /// applied to the database; publishes wait above it, so publishers
    /// faster than the database slow down to its pace instead of filling
    /// memory (and lengthening a graceful stop or the replay after a
    /// crash). Acks and receives never wait.
    #[arg(long, env = "LETTERBOX_MAX_UNAPPLIED", default_value = "256MiB")]
    pub max_unapplied: ByteSize,
    /// Most bytes of durable message bodies kept whole in memory while
    /// they wait to be copied into the database, the most recent ones, for
    /// consumers close behind the publishers; older ones give their memory
    /// back and are read from the log when delivered (0: none are kept).
    /// A batch being copied keeps its bodies until it is done.
    #[arg(long, env = "LETTERBOX_RECENT_PAYLOADS", default_value = "64MiB")]
    pub recent_payloads: ByteSize,
    /// Checkpoint after this many bytes of log.
    #[arg(long, env = "LETTERBOX_CHECKPOINT_BYTES", default_value = "128MiB")]
    pub checkpoint_bytes: ByteSize,
    /// Rewrite the embedded database once its files reach this size and
    /// are mostly free space (after a deep queue drained), giving the
    /// space back to the file system; 0 never rewrites.
    #[arg(long, env = "LETTERBOX_DB_REWRITE_MIN", default_value = "16MiB")]
    pub db_rewrite_min: ByteSize,
    /// A definitions file (queues, exchanges, bindings) applied at start,
    /// after recovery and before serving; an invalid file stops the start.
    #[arg(long, env = "LETTERBOX_DEFINITIONS")]
    pub definitions: Option<PathBuf>,
    /// How long a graceful shutdown waits for calls in flight.
    #[arg(long, env = "LETTERBOX_SHUTDOWN_GRACE", default_value = "10s")]
    pub shutdown_grace: Millis,
    /// Page cache of the embedded database.
    #[arg(long, env = "LETTERBOX_CACHE_SIZE", default_value = "256MiB")]
    pub cache_size: ByteSize,
    /// A TOML configuration file: any of these settings (keys spelled
    /// with `_`), and the `[[principals]]` who may connect.
    #[arg(long, env = "LETTERBOX_CONFIG")]
    pub config: Option<PathBuf>,
    /// Serve gRPC over TLS with this certificate chain (PEM); needs
    /// `--tls-key`.
    #[arg(long, env = "LETTERBOX_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, env = "LETTERBOX_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) that sign client certificates: clients may
    /// authenticate with a certificate (mTLS).
    #[arg(long, env = "LETTERBOX_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Refuse TLS connections without a valid client certificate.
    #[arg(long, env = "LETTERBOX_TLS_REQUIRE_CLIENT_CERT")]
    pub tls_require_client_cert: bool,
    /// Allow listening on a non-loopback address with no principals
    /// configured (anyone who can connect may do everything).
    #[arg(long, env = "LETTERBOX_ALLOW_REMOTE_WITHOUT_AUTH")]
    pub allow_remote_without_auth: bool,
    /// Most concurrent calls (HTTP/2 streams) on one connection.
    #[arg(long, env = "LETTERBOX_MAX_CONCURRENT_STREAMS", default_value = "1024")]
    pub max_concurrent_streams: u32,
    /// Most calls one connection has served at once; more wait their turn.
    #[arg(
        long,
        env = "LETTERBOX_MAX_CALLS_PER_CONNECTION",
        default_value = "1024"
    )]
    pub max_calls_per_connection: usize,
    /// Longest time a unary call may take, long polls included (a
    /// client's shorter deadline wins); streams are not cut.
    #[arg(long, env = "LETTERBOX_REQUEST_TIMEOUT", default_value = "60s")]
    pub request_timeout: Millis,
    /// Most connections open at once, over the gRPC, REST, console and
    /// metrics listeners; one more is closed at once. Default: all but a
    /// reserve (a quarter, at least 256) of the open files the process may
    /// have (its soft limit is raised to its hard limit at start), at most
    /// 10000.
    #[arg(long, env = "LETTERBOX_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most connections open at once from one client address, over all
    /// listeners; one more is closed at once. Default: a quarter of
    /// `--max-connections`. Behind a proxy every client has the proxy's
    /// address: raise it to `--max-connections` there.
    #[arg(long, env = "LETTERBOX_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,
    /// Connections each listener on (gRPC, REST, console, metrics) keeps
    /// for itself, which a flood of another cannot take; the rest of
    /// `--max-connections` is shared. Default: half of
    /// `--max-connections`, in equal parts.
    #[arg(long, env = "LETTERBOX_LISTENER_RESERVE")]
    pub listener_reserve: Option<usize>,
    /// How long a new connection may take to make its first request (the
    /// first call of a gRPC connection, TLS handshake included), whatever
    /// it sends meanwhile; one that does not is closed.
    #[arg(long, env = "LETTERBOX_HANDSHAKE_TIMEOUT", default_value = "10s")]
    pub handshake_timeout: Millis,
    /// How long an HTTP/1 request head (REST, console, metrics) may take
    /// to arrive whole after the previous answer, however its bytes
    /// trickle in; a keep-alive connection waiting this long for its next
    /// request is closed too.
    #[arg(long, env = "LETTERBOX_HEADER_TIMEOUT", default_value = "30s")]
    pub header_timeout: Millis,
    /// A gRPC connection with no call open for this long is closed (its
    /// client reconnects when it calls again; a long poll or an open
    /// stream keeps it).
    #[arg(long, env = "LETTERBOX_IDLE_TIMEOUT", default_value = "5m")]
    pub idle_timeout: Millis,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (off unless
    /// set; `https://` with the `--tls-cert` certificate when TLS is on;
    /// metrics carry queue names, so prefer loopback, a private network or
    /// a token).
    #[arg(long, env = "LETTERBOX_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// A file holding the bearer token `/metrics` requires
    /// (`Authorization: Bearer TOKEN`; surrounding whitespace is
    /// ignored). Without it or `--metrics-token`, no token is asked for.
    #[arg(
        long,
        env = "LETTERBOX_METRICS_TOKEN_FILE",
        conflicts_with = "metrics_token"
    )]
    pub metrics_token_file: Option<PathBuf>,
    /// The bearer token `/metrics` requires, given directly (prefer
    /// `--metrics-token-file` or the variable: a flag's value is visible
    /// to other users in the process list).
    #[arg(long, env = "LETTERBOX_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Each queue's figures in `/metrics` too (labelled `queue`), not only
    /// at `/metrics/per-queue`; without it `/metrics` sums them over all
    /// queues, a scrape whose size does not grow with their number.
    #[arg(long, env = "LETTERBOX_METRICS_PER_QUEUE")]
    pub metrics_per_queue: bool,
    /// Address for the Anypoint MQ compatible REST API (off unless given;
    /// port 0 picks a free port, printed on the second line of standard
    /// output).
    #[arg(long, env = "LETTERBOX_ANYPOINT_LISTEN")]
    pub anypoint_listen: Option<SocketAddr>,
    /// Unit of the `ttl` of the Anypoint lock-TTL PATCH calls (the
    /// specification says seconds; the rest of the API is milliseconds).
    #[arg(
        long,
        env = "LETTERBOX_ANYPOINT_LOCK_TTL_UNIT",
        value_enum,
        default_value = "ms"
    )]
    pub anypoint_lock_ttl_unit: crate::anypoint::LockTtlUnit,
    /// Address of the web console (`http://ADDR/`, `https://` under
    /// TLS), or `off`. Default: on loopback when gRPC listens on loopback
    /// (port 8025, or a free port if that one is taken), off otherwise.
    #[arg(long, env = "LETTERBOX_CONSOLE_LISTEN")]
    pub console_listen: Option<ConsoleListen>,
    /// Address of the SQS compatible endpoint (`http://ADDR/`, `https://`
    /// under TLS), or `off`. Default: on loopback when gRPC listens on
    /// loopback (port 9324, or a free port if that one is taken), off
    /// otherwise.
    #[arg(long, env = "LETTERBOX_SQS_LISTEN")]
    pub sqs_listen: Option<ConsoleListen>,
    /// The account id in the SQS endpoint's queue URLs and ARNs (12
    /// digits).
    #[arg(long, env = "LETTERBOX_SQS_ACCOUNT_ID", default_value = "000000000000")]
    pub sqs_account_id: String,
    /// The SQS endpoint's default region: that of requests that are not
    /// signed (a signed request's is its signature's); its queues keep
    /// their plain Letterbox names (another region's queue NAME is the
    /// Letterbox queue REGION.NAME).
    #[arg(long, env = "LETTERBOX_SQS_REGION", default_value = "us-east-1")]
    pub sqs_region: String,
    /// Time between two samples of the console's plots (each sample is
    /// one pass over every queue's figures).
    #[arg(long, env = "LETTERBOX_CONSOLE_SAMPLE_INTERVAL", default_value = "5s")]
    pub console_sample_interval: Millis,
    /// Keep the state in PostgreSQL instead of the data directory: a
    /// `postgres://` URL (several hosts, `postgres://a,b,c/db`, with
    /// `target_session_attrs=read-write` to follow a Patroni cluster's
    /// primary). The server owns the queues under a lease; see
    /// `--standby`.
    #[arg(long, env = "LETTERBOX_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// With `--store`: if another node owns the queues, wait and take over
    /// once its lease lapses, instead of refusing to start (the gRPC
    /// listener opens only once this node owns them).
    #[arg(long, env = "LETTERBOX_STANDBY")]
    pub standby: bool,
    /// With `--store`: this node's name in the ownership lease (default:
    /// the host name and the gRPC port). A node restarted under the same
    /// name takes its own lease back at once.
    #[arg(long, env = "LETTERBOX_NODE_NAME")]
    pub node_name: Option<String>,
    /// With `--store`: how long the ownership lease lasts without renewal
    /// (renewed every third of it). A standby takes over this long after
    /// the owner stopped renewing.
    #[arg(long, env = "LETTERBOX_LEASE_TTL", default_value = "10s")]
    pub lease_ttl: Millis,
    /// Principals, from the configuration file only.
    #[arg(skip)]
    pub principals: Vec<PrincipalConfig>,
}

/// Where the console listens: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleListen {
    /// Not served.
    Off,
    /// Served at this address.
    At(SocketAddr),
}

impl std::str::FromStr for ConsoleListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "none" | "false" => Ok(ConsoleListen::Off),
            t => t
                .parse()
                .map(ConsoleListen::At)
                .map_err(|_| format!("{s:?} is neither an address (like 127.0.0.1:8025) nor off")),
        }
    }
}

/// The console's port by default.
pub const CONSOLE_PORT: u16 = 8025;

fn read_pem(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{flag}: {}: {e}", path.display()))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!(
            "{flag}: {} is not a PEM file (no -----BEGIN line)",
            path.display()
        ));
    }
    Ok(bytes)
}

impl ServeArgs {
    /// Validates the flags and builds the server configuration; errors
    /// name the flag.
    pub fn server_config(&self) -> Result<ServerConfig, String> {
        let mut c = ServerConfig::new(self.data_dir.clone(), self.listen);
        let max_msg = self.max_message_size.0;
        if max_msg == 0 || max_msg > 256 << 20 {
            return Err(format!(
                "--max-message-size / LETTERBOX_MAX_MESSAGE_SIZE: {max_msg} bytes is out of range (1 byte to 256MiB)"
            ));
        }
        if self.wal_segment_size.0 < 64 << 10 {
            return Err(format!(
                "--wal-segment-size / LETTERBOX_WAL_SEGMENT_SIZE: {} bytes is below the minimum of 64KiB",
                self.wal_segment_size.0
            ));
        }
        if self.checkpoint_interval.0 < Duration::from_millis(10) {
            return Err(
                "--checkpoint-interval / LETTERBOX_CHECKPOINT_INTERVAL: must be at least 10ms"
                    .into(),
            );
        }
        let max_msg = usize::try_from(max_msg).map_err(|e| e.to_string())?;
        c.broker.max_message_size = max_msg;
        c.broker.max_response_bytes = self.max_response_size.0;
        c.max_request_bytes = max_msg + (4 << 20);
        c.store.segment_size = self.wal_segment_size.0;
        c.store.min_free_bytes = self.min_free_disk.0;
        c.store.checkpoint_interval = self.checkpoint_interval.0;
        c.store.checkpoint_bytes = self.checkpoint_bytes.0;
        c.store.apply_interval = self.apply_interval.0.max(Duration::from_millis(1));
        if self.max_unapplied.0 < 1 << 20 {
            return Err(format!(
                "--max-unapplied / LETTERBOX_MAX_UNAPPLIED: {} bytes is below the minimum of 1MiB",
                self.max_unapplied.0
            ));
        }
        c.store.max_unapplied_bytes = usize::try_from(self.max_unapplied.0).unwrap_or(usize::MAX);
        c.store.recent_payload_bytes =
            usize::try_from(self.recent_payloads.0).unwrap_or(usize::MAX);
        c.store.cache_bytes = self.cache_size.0;
        c.store.rewrite_min_bytes = self.db_rewrite_min.0;
        c.shutdown_grace = self.shutdown_grace.0;
        c.tls = self.tls()?;
        let auth = Authenticator::new(&self.principals).map_err(|e| format!("--config: {e}"))?;
        if auth.uses_certificates() && self.tls_client_ca.is_none() {
            return Err(
                "--config: principals with cert_sha256 need --tls-client-ca (client certificates are not asked for without it)".into(),
            );
        }
        if !auth.is_enabled() && !self.listen.ip().is_loopback() && !self.allow_remote_without_auth
        {
            return Err(format!(
                "--listen / LETTERBOX_LISTEN: {} is not a loopback address and no principals are configured, so anyone who can connect could use every queue; configure principals in the --config file, or pass --allow-remote-without-auth",
                self.listen
            ));
        }
        let auth_on = auth.is_enabled();
        c.auth = Arc::new(auth);
        c.metrics_listen = self.metrics_listen;
        c.metrics_token = self.metrics_token()?;
        c.metrics_per_queue = self.metrics_per_queue;
        if self.max_concurrent_streams == 0 {
            return Err("--max-concurrent-streams: must be at least 1".into());
        }
        if self.max_calls_per_connection == 0 {
            return Err("--max-calls-per-connection: must be at least 1".into());
        }
        if self.request_timeout.0 < Duration::from_secs(1) {
            return Err("--request-timeout: must be at least 1s".into());
        }
        if self.max_connections == Some(0) {
            return Err("--max-connections: must be at least 1".into());
        }
        if self.max_connections_per_address == Some(0) {
            return Err("--max-connections-per-address: must be at least 1".into());
        }
        if self.handshake_timeout.0 < Duration::from_millis(100) {
            return Err("--handshake-timeout: must be at least 100ms".into());
        }
        if self.header_timeout.0 < Duration::from_millis(100) {
            return Err("--header-timeout: must be at least 100ms".into());
        }
        if self.idle_timeout.0 < Duration::from_millis(100) {
            return Err("--idle-timeout: must be at least 100ms".into());
        }
        c.limits = Limits {
            max_concurrent_streams: self.max_concurrent_streams,
            concurrency_per_connection: self.max_calls_per_connection,
            request_timeout: self.request_timeout.0,
            max_connections: self.max_connections,
            max_connections_per_address: self.max_connections_per_address,
            listener_reserve: self.listener_reserve,
            handshake_timeout: self.handshake_timeout.0,
            header_timeout: self.header_timeout.0,
            idle_timeout: self.idle_timeout.0,
        };
        if let Some(a) = self.anypoint_listen
            && !auth_on
            && !a.ip().is_loopback()
            && !self.allow_remote_without_auth
        {
            return Err(format!(
                "--anypoint-listen / LETTERBOX_ANYPOINT_LISTEN: {a} is not a loopback address and no principals are configured; configure principals in the --config file, or pass --allow-remote-without-auth"
            ));
        }
        c.console_listen = match self.console_listen {
            Some(ConsoleListen::Off) => None,
            Some(ConsoleListen::At(a)) => {
                if !auth_on && !a.ip().is_loopback() && !self.allow_remote_without_auth {
                    return Err(format!(
                        "--console-listen / LETTERBOX_CONSOLE_LISTEN: {a} is not a loopback address and no principals are configured, so anyone who can connect could purge every queue; configure principals in the --config file, or pass --allow-remote-without-auth"
                    ));
                }
                Some(crate::server::ConsoleAt::Exactly(a))
            }
            // On by default beside a loopback gRPC listener only: a server
            // listening on the network opens no web page unless asked.
            None if self.listen.ip().is_loopback() => Some(crate::server::ConsoleAt::Preferred(
                SocketAddr::new(self.listen.ip(), CONSOLE_PORT),
            )),
            None => None,
        };
        c.sqs_listen = match self.sqs_listen {
            Some(ConsoleListen::Off) => None,
            Some(ConsoleListen::At(a)) => {
                if !auth_on && !a.ip().is_loopback() && !self.allow_remote_without_auth {
                    return Err(format!(
                        "--sqs-listen / LETTERBOX_SQS_LISTEN: {a} is not a loopback address and no principals are configured, so anyone who can connect could use every queue; configure principals in the --config file, or pass --allow-remote-without-auth"
                    ));
                }
                Some(crate::server::ConsoleAt::Exactly(a))
            }
            None if self.listen.ip().is_loopback() => Some(crate::server::ConsoleAt::Preferred(
                SocketAddr::new(self.listen.ip(), crate::sqs::DEFAULT_PORT),
            )),
            None => None,
        };
        if self.sqs_account_id.len() != 12
            || !self.sqs_account_id.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(format!(
                "--sqs-account-id / LETTERBOX_SQS_ACCOUNT_ID: {:?} is not an account id (12 digits)",
                self.sqs_account_id
            ));
        }
        let region_ok = !self.sqs_region.is_empty()
            && self.sqs_region.len() <= 32
            && self
                .sqs_region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !region_ok {
            return Err(format!(
                "--sqs-region / LETTERBOX_SQS_REGION: {:?} is not a region name (like us-east-1)",
                self.sqs_region
            ));
        }
        c.sqs.account_id = self.sqs_account_id.clone();
        c.sqs.region = self.sqs_region.clone();
        c.sqs.max_body_bytes = (2 * max_msg).max(8 << 20);
        if self.console_sample_interval.0 < Duration::from_millis(100) {
            return Err("--console-sample-interval: must be at least 100ms".into());
        }
        c.console_sample_every = self.console_sample_interval.0;
        c.anypoint_listen = self.anypoint_listen;
        c.anypoint.lock_ttl_unit = self.anypoint_lock_ttl_unit;
        c.anypoint.max_body_bytes = 10 * max_msg + (4 << 20);
        c.remote = self.remote_store()?;
        Ok(c)
    }

    /// The `--store` settings, checked.
    fn remote_store(&self) -> Result<Option<RemoteStore>, String> {
        let Some(url) = &self.store else {
            for (set, flag) in [
                (self.standby, "--standby"),
                (self.node_name.is_some(), "--node-name"),
            ] {
                if set {
                    return Err(format!(
                        "{flag}: needs --store postgres://... (a node of a highly available pair keeps its state in PostgreSQL)"
                    ));
                }
            }
            return Ok(None);
        };
        match url.split_once("://").map(|(s, _)| s) {
            Some("postgres" | "postgresql") => {}
            Some(scheme) => {
                return Err(format!(
                    "--store / LETTERBOX_STORE: scheme {scheme:?} is not postgres (write postgres://USER@HOST/DB, or leave it out to keep the state in --data-dir)"
                ));
            }
            None => {
                return Err(
                    "--store / LETTERBOX_STORE: not a URL (write postgres://USER@HOST/DB, or leave it out to keep the state in --data-dir)"
                        .into(),
                );
            }
        }
        if let Err(e) = crate::storage::pg::check_url(url) {
            return Err(format!(
                "--store / LETTERBOX_STORE: the postgres URL does not parse: {e}"
            ));
        }
        if self.lease_ttl.0 < Duration::from_secs(1) {
            return Err("--lease-ttl / LETTERBOX_LEASE_TTL: must be at least 1s".into());
        }
        let node = match &self.node_name {
            Some(n) if n.trim().is_empty() => {
                return Err("--node-name / LETTERBOX_NODE_NAME: the name is empty".into());
            }
            Some(n) => n.trim().to_string(),
            None => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "localhost".into());
                format!("{host}:{}", self.listen.port())
            }
        };
        Ok(Some(RemoteStore {
            url: url.clone(),
            node,
            lease_ttl: self.lease_ttl.0,
            standby: self.standby,
        }))
    }

    fn metrics_token(&self) -> Result<Option<String>, String> {
        let (flag, token) = match (&self.metrics_token_file, &self.metrics_token) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--metrics-token-file: {}: {e}", path.display()))?;
                ("--metrics-token-file", text.trim().to_string())
            }
            (None, Some(t)) => ("--metrics-token", t.trim().to_string()),
            (None, None) => return Ok(None),
        };
        if token.is_empty() {
            return Err(format!("{flag}: the token is empty"));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{flag}: the token must not contain spaces or control characters (it is sent in an HTTP header)"
            ));
        }
        Ok(Some(token))
    }

    fn tls(&self) -> Result<Option<TlsConfig>, String> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => (c, k),
            (None, None) => {
                if self.tls_client_ca.is_some() || self.tls_require_client_cert {
                    return Err(
                        "--tls-client-ca / --tls-require-client-cert: need --tls-cert and --tls-key"
                            .into(),
                    );
                }
                return Ok(None);
            }
            (Some(_), None) => return Err("--tls-cert: needs --tls-key".into()),
            (None, Some(_)) => return Err("--tls-key: needs --tls-cert".into()),
        };
        if self.tls_require_client_cert && self.tls_client_ca.is_none() {
            return Err("--tls-require-client-cert: needs --tls-client-ca".into());
        }
        let cert_pem = read_pem("--tls-cert", cert)?;
        crate::edge::tls::check_server_cert(&cert_pem)
            .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
        Ok(Some(TlsConfig {
            cert_pem,
            key_pem: read_pem("--tls-key", key)?,
            client_ca_pem: self
                .tls_client_ca
                .as_deref()
                .map(|p| read_pem("--tls-client-ca", p))
                .transpose()?,
            require_client_cert: self.tls_require_client_cert,
        }))
    }
}

/// Settings from a configuration file, ready to be merged.
#[derive(Debug, Default)]
pub struct FileSettings {
    /// `--key=value` arguments for the settings that neither a flag nor a
    /// variable gave; appended to the command line and parsed again.
    pub args: Vec<OsString>,
    /// The `[[principals]]`.
    pub principals: Vec<PrincipalConfig>,
}

/// Reads the TOML file at `path`. `given` are the matches of the command
/// line as parsed so far: a setting given there (by flag or variable) is
/// left alone. Every value is checked with its flag's parser; errors name
/// the file and the key.
pub fn read_config_file(path: &Path, given: &ArgMatches) -> Result<FileSettings, String> {
    let at = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config {at}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("--config {at}: {e}"))?;
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    let mut out = FileSettings::default();
    for (key, value) in table {
        if key == "principals" {
            out.principals = value
                .try_into()
                .map_err(|e: toml::de::Error| format!("--config {at}: principals: {e}"))?;
            continue;
        }
        let id = key.replace('-', "_");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id().as_str() == id && a.get_long().is_some() && id != "config")
            .ok_or_else(|| format!("--config {at}: unknown key `{key}`"))?;
        if matches!(
            given.value_source(&id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let long = arg.get_long().unwrap_or_default();
        let flag = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let text = match (&value, flag) {
            (toml::Value::Boolean(true), true) => {
                out.args.push(format!("--{long}").into());
                continue;
            }
            (toml::Value::Boolean(false), true) => continue,
            (_, true) => {
                return Err(format!("--config {at}: key `{key}`: must be true or false"));
            }
            (toml::Value::String(s), false) => s.clone(),
            (toml::Value::Integer(n), false) => n.to_string(),
            _ => {
                return Err(format!(
                    "--config {at}: key `{key}`: must be a string or an integer"
                ));
            }
        };
        // The flag's own parser checks the value.
        Command::new("serve")
            .no_binary_name(true)
            .arg(arg.clone())
            .try_get_matches_from([format!("--{long}={text}")])
            .map_err(|e| {
                let detail = e.to_string();
                let first = detail.lines().next().unwrap_or_default();
                let first = first.strip_prefix("error: ").unwrap_or(first);
                format!("--config {at}: key `{key}`: {first}")
            })?;
        out.args.push(format!("--{long}={text}").into());
    }
    Ok(out)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
