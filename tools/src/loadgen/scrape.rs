//! Reading Letterbox's Prometheus endpoint (`letterbox serve
//! --metrics-listen ADDR`): one HTTP/1.1 GET over loopback and the
//! text-format lines loadgen needs. Deliberately tiny: loadgen only reads
//! a few counters before and after a measured phase.

use super::target::LogCounters;
use anyhow::{Context as _, Result, anyhow, bail};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `http://host:port/path`, or `host:port` (path `/metrics`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsUrl {
    /// `host:port`, as given.
    pub authority: String,
    /// Absolute path, `/metrics` when none was given.
    pub path: String,
}

impl MetricsUrl {
    /// Parses a metrics URL; only plain `http` is supported.
    pub fn parse(url: &str) -> Result<MetricsUrl> {
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some((scheme, _)) => bail!(
                "metrics URL {url:?}: scheme {scheme:?} is not supported (use http://host:port/metrics)"
            ),
            None => url,
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        if authority.is_empty() || !authority.contains(':') {
            bail!("metrics URL {url:?}: expected host:port, e.g. http://127.0.0.1:9464/metrics");
        }
        Ok(MetricsUrl {
            authority: authority.to_string(),
            path: path.to_string(),
        })
    }

    /// GETs the page; fails on anything but `200`.
    pub async fn get(&self) -> Result<String> {
        let fetch = async {
            let mut s = TcpStream::connect(&self.authority).await.with_context(|| {
                format!("connecting to the metrics endpoint {}", self.authority)
            })?;
            let req = format!(
                "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAccept: text/plain\r\n\r\n",
                self.path, self.authority
            );
            s.write_all(req.as_bytes()).await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            anyhow::Ok(buf)
        };
        let buf = tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .map_err(|_| anyhow!("metrics endpoint {}: no answer in 10 s", self.authority))??;
        let text = String::from_utf8(buf).context("metrics page is not UTF-8")?;
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("metrics endpoint {}: malformed HTTP answer", self.authority))?;
        let status = head.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) != Some("200") {
            bail!("metrics endpoint {}{}: {status}", self.authority, self.path);
        }
        if head.lines().any(|l| {
            l.to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
        }) {
            return dechunk(body);
        }
        Ok(body.to_string())
    }

    /// The log counters from the page.
    pub async fn log_counters(&self) -> Result<LogCounters> {
        let page = self.get().await?;
        let need = |name: &str| {
            sample(&page, name)
                .map(|v| v as u64)
                .ok_or_else(|| anyhow!("metrics page of {} has no {name}", self.authority))
        };
        Ok(LogCounters {
            syncs: need("letterbox_log_syncs_total")?,
            bytes: need("letterbox_log_written_bytes_total")?,
            records: need("letterbox_log_records_total")?,
        })
    }
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("bad chunked metrics answer"))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| anyhow!("bad chunk size {size:?} in the metrics answer"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| anyhow!("truncated chunk in the metrics answer"))?;
        out.push_str(chunk);
        body = rest
            .get(size..)
            .and_then(|r| r.strip_prefix("\r\n"))
            .ok_or_else(|| anyhow!("bad chunk end in the metrics answer"))?;
    }
}

/// The value of an unlabelled sample `name value` in a text-format page.
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.split_whitespace().next()?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = MetricsUrl::parse("http://127.0.0.1:9464/metrics").unwrap();
        assert_eq!(u.authority, "127.0.0.1:9464");
        assert_eq!(u.path, "/metrics");
        assert_eq!(
            MetricsUrl::parse("127.0.0.1:9").unwrap().path,
            "/metrics".to_string()
        );
        let e = MetricsUrl::parse("https://x:1/").unwrap_err().to_string();
        assert!(e.contains("\"https\""), "{e}");
        let e = MetricsUrl::parse("http:///metrics")
            .unwrap_err()
            .to_string();
        assert!(e.contains("host:port"), "{e}");
    }

    #[test]
    fn samples_and_chunks() {
        let page = "# HELP letterbox_log_syncs fdatasync calls\n# TYPE letterbox_log_syncs counter\n\
                    letterbox_log_syncs_total 42\nletterbox_log_syncs_total_x 1\n\
                    letterbox_queue_depth{queue=\"a\"} 3\n";
        assert_eq!(sample(page, "letterbox_log_syncs_total"), Some(42.0));
        assert_eq!(sample(page, "letterbox_log_records_total"), None);
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").unwrap(),
            "hello world"
        );
        assert!(dechunk("zz\r\n").is_err());
    }
}
