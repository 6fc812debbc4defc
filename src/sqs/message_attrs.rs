//! Message attributes ⇄ Letterbox properties, and the MD5 digests SQS
//! clients check.
//!
//! A message attribute becomes a property of the same name. Its value is
//! the attribute's string value, or for a `Binary` attribute its bytes in
//! base64. Types other than plain `String` (`Number`, `Binary`, and any
//! with a custom suffix such as `Number.java.lang.Long`) are named in the
//! reserved property [`TYPES`], a JSON object from attribute name to data
//! type, so that a receive gives back exactly what was sent. A property
//! set over gRPC or the console is a `String` attribute.
//!
//! Properties whose names start with [`RESERVED`] carry what SQS keeps
//! beside the attributes (the sender, the trace header, the deduplication
//! id); names with `:` cannot be SQS attribute names, so they never clash
//! with a client's.
//!
//! The digests are AWS's: `MD5OfMessageBody` is the MD5 of the body's
//! UTF-8 bytes; `MD5OfMessageAttributes` (and `…SystemAttributes`) the
//! MD5 of, for each attribute in name order, the name, the data type
//! (each as a 4-byte big-endian length and the UTF-8 bytes), a transport
//! byte (1 string, 2 binary) and the value (length and bytes).

use std::collections::BTreeMap;

use base64::Engine as _;
use md5::{Digest, Md5};
use serde_json::{Map, Value};

use super::error::SqsError;

/// The prefix of the properties the SQS endpoint keeps for itself.
pub(crate) const RESERVED: &str = "sqs:";
/// The data types of the attributes that are not plain `String`.
pub(crate) const TYPES: &str = "sqs:types";
/// `SenderId`.
pub(crate) const SENDER: &str = "sqs:SenderId";
/// `AWSTraceHeader`.
pub(crate) const TRACE: &str = "sqs:AWSTraceHeader";
/// `MessageDeduplicationId`.
pub(crate) const DEDUP: &str = "sqs:MessageDeduplicationId";
/// `MessageGroupId` of a message sent to a standard queue.
pub(crate) const GROUP: &str = "sqs:MessageGroupId";

/// Most message attributes per message.
const MAX_ATTRIBUTES: usize = 10;

/// One attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttrValue {
    /// `String`, `Number`, `Binary`, possibly with a custom suffix.
    pub(crate) data_type: String,
    /// The value of a `String` or `Number` attribute.
    pub(crate) string: Option<String>,
    /// The value of a `Binary` attribute.
    pub(crate) binary: Option<Vec<u8>>,
}

impl AttrValue {
    fn is_binary(&self) -> bool {
        base_type(&self.data_type) == "Binary"
    }

    /// Bytes counted against the message size (name not included).
    pub(crate) fn size(&self) -> usize {
        self.data_type.len()
            + self.string.as_ref().map_or(0, String::len)
            + self.binary.as_ref().map_or(0, Vec::len)
    }

    /// Its JSON form: `{"StringValue"|"BinaryValue": ..., "DataType": ...}`
    /// (binary in base64).
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(s) = &self.string {
            m.insert("StringValue".into(), s.clone().into());
        }
        if let Some(b) = &self.binary {
            m.insert(
                "BinaryValue".into(),
                base64::engine::general_purpose::STANDARD.encode(b).into(),
            );
        }
        m.insert("DataType".into(), self.data_type.clone().into());
        Value::Object(m)
    }
}

/// Attributes by name.
pub(crate) type Attrs = BTreeMap<String, AttrValue>;

/// The part of a data type before its first `.`.
fn base_type(t: &str) -> &str {
    t.split('.').next().unwrap_or(t)
}

/// Checks an attribute name as SQS does.
fn check_name(name: &str) -> Result<(), SqsError> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if name.is_empty() || name.len() > 256 || !valid_chars {
        return Err(SqsError::invalid(format!(
            "The message attribute name '{name}' is invalid. Attribute name can contain A-Z, a-z, \
             0-9, underscore (_), hyphen (-), and period (.) characters."
        )));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        return Err(SqsError::invalid(format!(
            "The message attribute name '{name}' is reserved for use by Amazon."
        )));
    }
    if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        return Err(SqsError::invalid(format!(
            "The message attribute name '{name}' is invalid: it must not start or end with a \
             period, nor hold two periods in a row."
        )));
    }
    Ok(())
}

/// Reads a `MessageAttributes` (or `MessageSystemAttributes`) map from a
/// request; `what` is "message attribute" or "message system attribute"
/// in errors.
pub(crate) fn parse(v: Option<&Value>, system: bool) -> Result<Attrs, SqsError> {
    let mut out = Attrs::new();
    let Some(v) = v else {
        return Ok(out);
    };
    let Value::Object(map) = v else {
        return Err(SqsError::invalid(
            "MessageAttributes must be a map of attribute names to values.",
        ));
    };
    if !system && map.len() > MAX_ATTRIBUTES {
        return Err(SqsError::invalid(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].",
            map.len()
        )));
    }
    for (name, value) in map {
        if system {
            if name != "AWSTraceHeader" {
                return Err(SqsError::invalid(format!(
                    "Message system attribute name '{name}' is invalid: only AWSTraceHeader can be sent."
                )));
            }
        } else {
            check_name(name)?;
        }
        let data_type = value
            .get("DataType")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if data_type.is_empty() {
            return Err(SqsError::invalid(format!(
                "The message attribute '{name}' must contain non-empty message attribute type."
            )));
        }
        if !matches!(base_type(&data_type), "String" | "Number" | "Binary") {
            return Err(SqsError::invalid(format!(
                "The message attribute '{name}' has an invalid message attribute type, the set of \
                 supported type prefixes is Binary, Number, and String."
            )));
        }
        let string = value
            .get("StringValue")
            .and_then(Value::as_str)
            .map(str::to_string);
        let binary = match value.get("BinaryValue").and_then(Value::as_str) {
            None => None,
            Some(b) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .map_err(|e| {
                        SqsError::invalid(format!(
                            "The message attribute '{name}' has a BinaryValue that is not base64: {e}"
                        ))
                    })?,
            ),
        };
        let attr = AttrValue {
            data_type,
            string,
            binary,
        };
        let empty = if attr.is_binary() {
            attr.binary.as_ref().is_none_or(Vec::is_empty)
        } else {
            attr.string.as_ref().is_none_or(String::is_empty)
        };
        if empty {
            return Err(SqsError::invalid(format!(
                "The message attribute '{name}' must contain non-empty message attribute value for \
                 message attribute type '{}'.",
                base_type(&attr.data_type)
            )));
        }
        if base_type(&attr.data_type) == "Number" {
            let s = attr.string.as_deref().unwrap_or_default();
            if !is_number(s) {
                return Err(SqsError::invalid(format!(
                    "Can't cast {s:?} to a number: the message attribute '{name}' is of type Number."
                )));
            }
        }
        out.insert(name.clone(), attr);
    }
    Ok(out)
}

/// A decimal number as SQS takes it: optional sign, digits, an optional
/// fraction and exponent.
fn is_number(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty() && s.len() <= 64 && s.parse::<f64>().is_ok_and(f64::is_finite)
}

/// The properties that carry `attrs`: one per attribute, and [`TYPES`]
/// when a type is not plain `String`.
pub(crate) fn to_properties(attrs: &Attrs, props: &mut Vec<(String, String)>) {
    let mut types = Map::new();
    for (name, a) in attrs {
        let value = match &a.binary {
            Some(b) if a.is_binary() => base64::engine::general_purpose::STANDARD.encode(b),
            _ => a.string.clone().unwrap_or_default(),
        };
        props.push((name.clone(), value));
        if a.data_type != "String" {
            types.insert(name.clone(), a.data_type.clone().into());
        }
    }
    if !types.is_empty() {
        props.push((TYPES.to_string(), Value::Object(types).to_string()));
    }
}

/// The attributes a message's properties carry (reserved ones left out).
pub(crate) fn from_properties(props: &[(String, String)]) -> Attrs {
    let types: Map<String, Value> = props
        .iter()
        .find(|(k, _)| k == TYPES)
        .and_then(|(_, v)| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let mut out = Attrs::new();
    for (k, v) in props {
        if k.starts_with(RESERVED) {
            continue;
        }
        let data_type = types
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("String")
            .to_string();
        let attr = if base_type(&data_type) == "Binary" {
            match base64::engine::general_purpose::STANDARD.decode(v) {
                Ok(b) => AttrValue {
                    data_type,
                    string: None,
                    binary: Some(b),
                },
                Err(_) => AttrValue {
                    data_type: "String".into(),
                    string: Some(v.clone()),
                    binary: None,
                },
            }
        } else {
            AttrValue {
                data_type,
                string: Some(v.clone()),
                binary: None,
            }
        };
        out.insert(k.clone(), attr);
    }
    out
}

/// The value of a reserved property.
pub(crate) fn reserved<'a>(props: &'a [(String, String)], name: &str) -> Option<&'a str> {
    props
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The MD5 of a body, in hex.
pub(crate) fn md5_of_body(body: &[u8]) -> String {
    hex(&Md5::digest(body))
}

/// AWS's MD5 of a set of attributes, in hex; `None` when there are none.
pub(crate) fn md5_of_attributes(attrs: &Attrs) -> Option<String> {
    if attrs.is_empty() {
        return None;
    }
    fn field(h: &mut Md5, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        h.update(len.to_be_bytes());
        h.update(bytes);
    }
    let mut h = Md5::new();
    for (name, a) in attrs {
        field(&mut h, name.as_bytes());
        field(&mut h, a.data_type.as_bytes());
        match (&a.binary, &a.string) {
            (Some(b), _) if a.is_binary() => {
                h.update([2u8]);
                field(&mut h, b);
            }
            (_, s) => {
                h.update([1u8]);
                field(&mut h, s.as_deref().unwrap_or_default().as_bytes());
            }
        }
    }
    Some(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// The FIFO `SequenceNumber` of a message whose id the server chose (26
/// characters of Crockford base32 of time, position and salt): that
/// 128-bit number in decimal, which grows with every message a queue
/// takes. `None` for a client-chosen id.
pub(crate) fn sequence_number(message_id: &str) -> Option<String> {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if message_id.len() != 26 {
        return None;
    }
    let mut v: u128 = 0;
    for c in message_id.bytes() {
        let d = ALPHABET.iter().position(|&a| a == c)?;
        v = v.checked_shl(5)? | u128::try_from(d).ok()?;
    }
    Some(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(t: &str, s: &str) -> AttrValue {
        AttrValue {
            data_type: t.into(),
            string: Some(s.into()),
            binary: None,
        }
    }

    /// The digests AWS gives for these attributes (the values moto's tests
    /// hold, checked against AWS).
    #[test]
    fn digests_are_aws_digests() {
        assert_eq!(md5_of_body(b"derp"), "58fd9edd83341c29f1aebba81c31e257");
        let mut a = Attrs::new();
        a.insert(
            "SOME_Valid.attribute-Name".into(),
            attr("Number", "1493147359900"),
        );
        assert_eq!(
            md5_of_attributes(&a).as_deref(),
            Some("36655e7e9d7c0e8479fa3f3f42247ae7")
        );
        let mut a = Attrs::new();
        a.insert(
            "id".into(),
            attr("String", "453ae55e-f03b-21a6-a4b1-70c2e2e8fe71"),
        );
        a.insert(
            "mybin".into(),
            AttrValue {
                data_type: "Binary".into(),
                string: None,
                binary: Some(b"kekchebukek".to_vec()),
            },
        );
        a.insert(
            "timestamp".into(),
            attr("Number.java.lang.Long", "1603134247654"),
        );
        a.insert("contentType".into(), attr("String", "application/json"));
        assert_eq!(
            md5_of_attributes(&a).as_deref(),
            Some("049075255ebc53fb95f7f9f3cedf3c50")
        );
        assert_eq!(md5_of_attributes(&Attrs::new()), None);
    }

    #[test]
    fn attributes_round_trip_through_properties_with_their_types() {
        let mut a = Attrs::new();
        a.insert("n".into(), attr("Number.int", "5"));
        a.insert("s".into(), attr("String", "x"));
        a.insert(
            "b".into(),
            AttrValue {
                data_type: "Binary".into(),
                string: None,
                binary: Some(vec![0, 255, 7]),
            },
        );
        let mut props = vec![(SENDER.to_string(), "me".to_string())];
        to_properties(&a, &mut props);
        assert!(props.iter().any(|(k, v)| k == "s" && v == "x"));
        assert_eq!(from_properties(&props), a);
        // A property set over gRPC is a String attribute.
        let plain = from_properties(&[("k".into(), "v".into())]);
        assert_eq!(plain.get("k"), Some(&attr("String", "v")));
    }

    #[test]
    fn names_and_types_are_checked_as_sqs_checks_them() {
        let bad = serde_json::json!({"öther": {"DataType": "String", "StringValue": "x"}});
        let e = parse(Some(&bad), false).unwrap_err();
        assert!(
            e.message
                .starts_with("The message attribute name 'öther' is invalid.")
        );
        let bad = serde_json::json!({"t": {"DataType": "InvalidNumber", "StringValue": "1"}});
        let e = parse(Some(&bad), false).unwrap_err();
        assert_eq!(
            e.message,
            "The message attribute 't' has an invalid message attribute type, the set of supported type prefixes is Binary, Number, and String."
        );
        let bad = serde_json::json!({"AWS.x": {"DataType": "String", "StringValue": "1"}});
        assert!(parse(Some(&bad), false).is_err());
    }

    #[test]
    fn sequence_numbers_come_from_server_ids_and_grow() {
        let a = sequence_number("01GZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
        let b = sequence_number("01H00000000000000000000000").unwrap();
        let (na, nb): (u128, u128) = (a.parse().unwrap(), b.parse().unwrap());
        assert_eq!(na + 1, nb);
        assert_eq!(
            sequence_number("0000000000000000000000000A").as_deref(),
            Some("10")
        );
        assert_eq!(sequence_number("client-id"), None);
        assert_eq!(sequence_number("0000000000000000000000000U"), None);
    }
}
