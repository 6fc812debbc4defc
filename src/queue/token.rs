//! Ack tokens: which lease of which message a consumer holds.
//!
//! A token names the queue (its internal number, never reused), the
//! message's position and the lease's epoch (how many leases the message
//! had been granted at that position, this one included). Settling checks all three against the current lease, so a late
//! ack from a consumer whose lease ran out (and whose message went to
//! someone else) fails and changes nothing. Tokens survive restarts, as
//! leases do. Text form: 40 hex digits (queue, position, epoch, CRC-32).

use super::error::{QueueError, Result};

/// A parsed ack token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckToken {
    /// The queue's internal number.
    pub qid: u32,
    /// The message's position.
    pub pos: u64,
    /// The lease's epoch.
    pub epoch: u32,
}

impl AckToken {
    fn body(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.qid.to_be_bytes());
        b[4..12].copy_from_slice(&self.pos.to_be_bytes());
        b[12..].copy_from_slice(&self.epoch.to_be_bytes());
        b
    }

    /// Parses a token given in a request; `field` names it in errors.
    pub fn parse(field: &str, text: &str) -> Result<AckToken> {
        let bad = |reason: &str| QueueError::invalid(field, text, reason);
        let digits = text.as_bytes();
        if digits.len() != 2 * RAW {
            return Err(bad("is not an ack token (40 hex digits)"));
        }
        let mut raw = [0u8; RAW];
        for (byte, pair) in raw.iter_mut().zip(digits.chunks_exact(2)) {
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(hi), Some(lo)) => *byte = hi << 4 | lo,
                _ => return Err(bad("is not an ack token (40 hex digits)")),
            }
        }
        let t = AckToken {
            qid: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
            pos: u64::from_be_bytes(raw[4..12].try_into().map_err(|_| bad("is malformed"))?),
            epoch: u32::from_be_bytes([raw[12], raw[13], raw[14], raw[15]]),
        };
        let crc = u32::from_be_bytes([raw[16], raw[17], raw[18], raw[19]]);
        if crc32fast::hash(&t.body()) != crc {
            return Err(bad("is damaged (checksum mismatch)"));
        }
        Ok(t)
    }
}

/// Bytes in a token: the body and its CRC-32.
const RAW: usize = 20;

/// The value of one hex digit (either case).
fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

// Written digit by digit from a table: one token goes out with every
// delivery and comes back with every ack, and `{:02x}` per byte was about
// 4 % of the server's CPU in a drain.
impl std::fmt::Display for AckToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let body = self.body();
        let crc = crc32fast::hash(&body).to_be_bytes();
        let mut text = [0u8; 2 * RAW];
        for (pair, b) in text.chunks_exact_mut(2).zip(body.iter().chain(crc.iter())) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        // Only ASCII digits were written.
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_damage() {
        let t = AckToken {
            qid: 7,
            pos: 1 << 40,
            epoch: 3,
        };
        let s = t.to_string();
        assert_eq!(s.len(), 40);
        assert!(s.starts_with("00000007000001000000000000000003"), "{s}");
        assert_eq!(s, s.to_lowercase());
        assert_eq!(
            AckToken::parse("t", &s.to_uppercase()).expect("either case"),
            t
        );
        // Forty bytes that are not forty hex digits.
        assert!(AckToken::parse("t", &format!("é{}", &s[2..])).is_err());
        assert!(AckToken::parse("t", &format!("+{}", &s[1..])).is_err());
        assert_eq!(AckToken::parse("t", &s).expect("parses"), t);
        let mut damaged = s.clone().into_bytes();
        damaged[10] = if damaged[10] == b'0' { b'1' } else { b'0' };
        let damaged = String::from_utf8(damaged).expect("ascii");
        assert!(AckToken::parse("t", &damaged).is_err());
        assert!(AckToken::parse("t", "").is_err());
        assert!(AckToken::parse("t", &"zz".repeat(20)).is_err());
        let err = AckToken::parse("ack_tokens[2]", "nope")
            .expect_err("bad")
            .to_string();
        assert!(
            err.contains("ack_tokens[2]") && err.contains("nope"),
            "{err}"
        );
    }
}
