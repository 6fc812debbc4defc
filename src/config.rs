//! Server configuration from flags and `LETTERBOX_*` environment variables
//! (a flag wins over its variable, which wins over the default), validated
//! before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::server::ServerConfig;
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
    /// Checkpoint after this many bytes of log.
    #[arg(long, env = "LETTERBOX_CHECKPOINT_BYTES", default_value = "128MiB")]
    pub checkpoint_bytes: ByteSize,
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
        c.store.cache_bytes = self.cache_size.0;
        c.shutdown_grace = self.shutdown_grace.0;
        c.anypoint_listen = self.anypoint_listen;
        c.anypoint.lock_ttl_unit = self.anypoint_lock_ttl_unit;
        c.anypoint.max_body_bytes = 10 * max_msg + (4 << 20);
        Ok(c)
    }
}
