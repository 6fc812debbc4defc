//! Sizes and durations as people write them on command lines:
//! `64MiB`, `500ms`, `30s`.

use std::str::FromStr;
use std::time::Duration;

/// A size in bytes, written as a number with an optional binary suffix:
/// `1048576`, `512KiB`, `64MiB`, `1GiB` (also `k`, `m`, `g`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size (examples: 4096, 512KiB, 64MiB)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            other => {
                return Err(format!(
                    "{s:?} has an unknown unit {other:?} (use KiB, MiB or GiB)"
                ));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

/// A duration written as a number with a unit: `500ms`, `30s`, `5m`, `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub Duration);

impl Millis {
    /// The duration in milliseconds.
    pub fn as_ms(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl FromStr for Millis {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 30s, 5m)"))?;
        let ms = match unit.trim() {
            "ms" => n,
            "s" | "" => n.saturating_mul(1000),
            "m" => n.saturating_mul(60_000),
            "h" => n.saturating_mul(3_600_000),
            other => {
                return Err(format!(
                    "{s:?} has an unknown unit {other:?} (use ms, s, m or h)"
                ));
            }
        };
        Ok(Millis(Duration::from_millis(ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize(4096)));
        assert_eq!("64MiB".parse::<ByteSize>(), Ok(ByteSize(64 << 20)));
        assert_eq!("2g".parse::<ByteSize>(), Ok(ByteSize(2 << 30)));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert_eq!(
            "500ms".parse::<Millis>(),
            Ok(Millis(Duration::from_millis(500)))
        );
        assert_eq!("2m".parse::<Millis>(), Ok(Millis(Duration::from_secs(120))));
        assert!("1 fortnight".parse::<Millis>().is_err());
    }
}
