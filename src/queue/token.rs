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
        if text.len() != 40 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("is not an ack token (40 hex digits)"));
        }
        let mut raw = [0u8; 20];
        for (i, byte) in raw.iter_mut().enumerate() {
            *byte =
                u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad("is not hex"))?;
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

impl std::fmt::Display for AckToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body();
        for b in body
            .iter()
            .chain(crc32fast::hash(&body).to_be_bytes().iter())
        {
            write!(f, "{b:02x}")?;
        }
        Ok(())
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
