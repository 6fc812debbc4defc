//! Each region its own queues, as in SQS: the queue `NAME` of the
//! server's default region (`--sqs-region`) is the Letterbox queue `NAME`;
//! of any other region `REGION`, the Letterbox queue `REGION.NAME` (an
//! SQS name has no `.` but a `.fifo` ending, so the two never meet).
//! gRPC, the CLI, the console and grants see those names: `eu-west-1.orders`
//! is the queue `orders` of `eu-west-1` over SQS.
//!
//! The default region lists every queue but those whose name begins with
//! a region-shaped word and a dot (`eu-west-1.`, `us-gov-west-1.`); a
//! queue made over gRPC with such a name belongs to that region over
//! SQS. A request's region is its signature's scope (unsigned: the
//! default region).

/// Whether `s` is shaped as an AWS region: lower-case letters, words
/// joined by `-`, a number last (`us-east-1`, `us-gov-west-1`).
pub(crate) fn region_shaped(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `s` can name a region here: 1 to 64 letters, digits or `-`
/// (a queue's Letterbox name begins with it).
pub(crate) fn valid(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The regions of one server: its default.
#[derive(Debug, Clone)]
pub(crate) struct Regions {
    /// The default region (`--sqs-region`).
    pub(crate) default: String,
}

impl Regions {
    /// The Letterbox name of the queue `name` of `region`.
    pub(crate) fn engine(&self, region: &str, name: &str) -> String {
        if region == self.default {
            name.to_string()
        } else {
            format!("{region}.{name}")
        }
    }

    /// The SQS name of the Letterbox queue `engine` if it belongs to
    /// `region`.
    pub(crate) fn local<'a>(&self, region: &str, engine: &'a str) -> Option<&'a str> {
        if region == self.default {
            match engine.split_once('.') {
                Some((p, rest)) if !rest.is_empty() && region_shaped(p) => None,
                _ => Some(engine),
            }
        } else {
            engine
                .strip_prefix(region)
                .and_then(|r| r.strip_prefix('.'))
                .filter(|n| !n.is_empty())
        }
    }

    /// The region and SQS name of the Letterbox queue `engine`, seen from
    /// a request of `region`.
    pub(crate) fn split<'a>(&'a self, region: &'a str, engine: &'a str) -> (&'a str, &'a str) {
        if let Some(n) = self.local(region, engine) {
            return (region, n);
        }
        match engine.split_once('.') {
            Some((p, rest)) if !rest.is_empty() && region_shaped(p) => (p, rest),
            _ => (&self.default, engine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_region_has_its_own_names() {
        let r = Regions {
            default: "us-east-1".into(),
        };
        assert!(region_shaped("eu-west-1") && region_shaped("us-gov-west-1"));
        assert!(valid("local") && valid("eu-west-1") && !valid("a.b") && !valid(""));
        assert!(!region_shaped("orders") && !region_shaped("a-b") && !region_shaped("Eu-west-1"));
        assert_eq!(r.engine("us-east-1", "orders"), "orders");
        assert_eq!(r.engine("eu-west-1", "orders"), "eu-west-1.orders");
        assert_eq!(r.engine("local", "q.fifo"), "local.q.fifo");
        assert_eq!(r.local("us-east-1", "orders"), Some("orders"));
        assert_eq!(r.local("us-east-1", "orders.v2"), Some("orders.v2"));
        assert_eq!(r.local("us-east-1", "eu-west-1.orders"), None);
        assert_eq!(r.local("eu-west-1", "eu-west-1.orders"), Some("orders"));
        assert_eq!(r.local("eu-west-1", "orders"), None);
        assert_eq!(r.local("eu-west-1", "eu-west-10.orders"), None);
        assert_eq!(r.local("local", "local.q.fifo"), Some("q.fifo"));
        assert_eq!(r.split("us-east-1", "eu-west-1.dlq"), ("eu-west-1", "dlq"));
        assert_eq!(r.split("eu-west-1", "dlq"), ("us-east-1", "dlq"));
        assert_eq!(r.split("local", "local.dlq"), ("local", "dlq"));
    }
}
