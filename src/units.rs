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
    /// `500ms`, `30s`, `5m`, `2h`, `7d`, sums of them (`1h30m`), or a
    /// bare number of seconds: every form [`Millis`]'s `Display` prints.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || format!("{s:?} is not a duration (examples: 500ms, 30s, 5m, 2h, 7d, 1h30m)");
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            let n: u64 = t.parse().map_err(|_| bad())?;
            return Ok(Millis(Duration::from_millis(n.saturating_mul(1000))));
        }
        let mut rest = t;
        let mut total: u64 = 0;
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = rest[..unit_len].trim();
            rest = &rest[unit_len..];
            let size: u64 = match unit {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                other => {
                    return Err(format!(
                        "{s:?} has an unknown unit {other:?} (use ms, s, m, h or d)"
                    ));
                }
            };
            total = total.saturating_add(n.saturating_mul(size));
        }
        Ok(Millis(Duration::from_millis(total)))
    }
}

impl std::fmt::Display for Millis {
    /// The shortest exact form with one unit: `500ms`, `30s`, `2m`, `7d`
    /// (`90s`, not `1m30s`); it parses back to the same value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = self.as_ms();
        for (unit, size) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms >= size && ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

/// An instant on the command line, as milliseconds since the Unix epoch:
/// RFC 3339 (`2026-12-04T10:00:00Z`), a time before `now_ms`
/// (`-1h`, `30m ago`, `now`), or a number of milliseconds since the epoch.
pub fn parse_instant(s: &str, now_ms: u64) -> Result<u64, String> {
    let t = s.trim();
    if t == "now" {
        return Ok(now_ms);
    }
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map_err(|_| format!("{s:?} is too large for milliseconds since the epoch"));
    }
    let ago = t
        .strip_prefix('-')
        .or_else(|| t.strip_suffix("ago").map(str::trim_end));
    if let Some(d) = ago {
        let d: Millis = d.parse().map_err(|e: String| {
            format!("{s:?}: {e}; a relative time is like -1h or \"30m ago\"")
        })?;
        return Ok(now_ms.saturating_sub(d.as_ms()));
    }
    match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(dt) => u64::try_from(dt.timestamp_millis()).map_err(|_| format!("{s:?} is before 1970")),
        Err(e) => Err(format!(
            "{s:?} is not a time ({e}): use RFC 3339 (2026-12-04T10:00:00Z), a relative time (-1h, \"30m ago\", now) or milliseconds since the epoch"
        )),
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
        assert_eq!(
            "7d".parse::<Millis>(),
            Ok(Millis(Duration::from_secs(7 * 86_400)))
        );
        assert_eq!(
            "1h30m".parse::<Millis>(),
            Ok(Millis(Duration::from_secs(5400)))
        );
        assert_eq!("90".parse::<Millis>(), Ok(Millis(Duration::from_secs(90))));
        for bad in ["", "ms", "5x", "1h 30", "-5s"] {
            assert!(bad.parse::<Millis>().is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn printed_durations_parse_back(ms in 0u64..=(1u64 << 44)) {
            let d = Millis(Duration::from_millis(ms));
            proptest::prop_assert_eq!(d.to_string().parse::<Millis>(), Ok(d));
        }
    }

    #[test]
    fn instants_parse_in_every_form() {
        let now = 1_764_842_400_000; // 2025-12-04T10:00:00Z
        assert_eq!(parse_instant("1764842400000", now), Ok(now));
        assert_eq!(parse_instant("2025-12-04T10:00:00Z", now), Ok(now));
        assert_eq!(parse_instant("2025-12-04T11:00:00+01:00", now), Ok(now));
        assert_eq!(parse_instant("-1h", now), Ok(now - 3_600_000));
        assert_eq!(parse_instant("30m ago", now), Ok(now - 1_800_000));
        assert_eq!(parse_instant("now", now), Ok(now));
        let e = parse_instant("yesterday", now).unwrap_err();
        assert!(e.contains("RFC 3339"), "{e}");
    }
}

/// `n` and the noun in agreement with it: "1 delivery", "3 deliveries",
/// "0 failed attempts".
pub fn count_of(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod count_of_tests {
    #[test]
    fn the_noun_agrees_with_the_number() {
        assert_eq!(super::count_of(1, "delivery", "deliveries"), "1 delivery");
        assert_eq!(super::count_of(0, "delivery", "deliveries"), "0 deliveries");
        assert_eq!(
            super::count_of(3, "failed attempt", "failed attempts"),
            "3 failed attempts"
        );
    }
}
