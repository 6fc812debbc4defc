//! The two wire protocols SQS clients speak, decoded into one form (the
//! JSON protocol's input object) and encoded from one form (its output
//! object).
//!
//! - **AWS JSON 1.0**: `POST /` with `X-Amz-Target: AmazonSQS.<Action>`
//!   and a JSON body; answers are JSON, errors `{"__type", "message"}`
//!   with `X-Amzn-Errortype`, and `x-amzn-query-error: CODE;Sender` when
//!   the request carries `x-amzn-query-mode: true` (botocore, the AWS CLI
//!   and the JavaScript SDK do, and read the code from it).
//! - **Query**: `Action=<Action>&...` form-encoded in a POST body or in
//!   the query string of a GET; answers are XML
//!   (`<ActionResponse><ActionResult>...`), errors `<ErrorResponse>`.
//!   Its parameter names (`Attribute.1.Name`, `MessageAttribute.1.Value.
//!   StringValue`, `SendMessageBatchRequestEntry.2.Id`) are turned into
//!   the JSON protocol's members by [`from_query`].

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Map, Value};

use super::error::SqsError;

/// The XML namespace of SQS's query answers.
const XMLNS: &str = "http://queue.amazonaws.com/doc/2012-11-05/";

/// How a request came, and so how to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// AWS JSON 1.0; `query_mode`: the client asked for the query
    /// protocol's error codes.
    Json {
        /// `x-amzn-query-mode: true` was sent.
        query_mode: bool,
    },
    /// The query protocol.
    Query,
}

/// A decoded request.
#[derive(Debug)]
pub(crate) struct Request {
    /// The action's name.
    pub(crate) action: String,
    /// Its input, in the JSON protocol's form.
    pub(crate) input: Value,
}

/// The wire of a request, from its headers.
pub(crate) fn wire(headers: &HeaderMap) -> Wire {
    if headers.contains_key("x-amz-target") {
        let query_mode = headers
            .get("x-amzn-query-mode")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Wire::Json { query_mode }
    } else {
        Wire::Query
    }
}

/// Decodes a request: its action and input. `path_queue` is the queue URL
/// a query request's path names (`/ACCOUNT/NAME`), used when the request
/// gives no `QueueUrl`.
pub(crate) fn decode(
    wire: Wire,
    headers: &HeaderMap,
    query: Option<&str>,
    body: &[u8],
    path_queue: Option<String>,
) -> Result<Request, SqsError> {
    match wire {
        Wire::Json { .. } => {
            let target = headers
                .get("x-amz-target")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let Some(action) = target.strip_prefix("AmazonSQS.") else {
                return Err(SqsError::invalid_action(target));
            };
            let input = if body.iter().all(u8::is_ascii_whitespace) {
                Value::Object(Map::new())
            } else {
                serde_json::from_slice(body).map_err(|e| {
                    SqsError::malformed(format!("the request body is not valid JSON: {e}"))
                })?
            };
            if !input.is_object() {
                return Err(SqsError::malformed(
                    "the request body must be a JSON object",
                ));
            }
            Ok(Request {
                action: action.to_string(),
                input,
            })
        }
        Wire::Query => {
            let mut pairs: Vec<(String, String)> = query
                .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default();
            pairs.extend(form_urlencoded::parse(body).into_owned());
            let action = pairs
                .iter()
                .rev()
                .find(|(k, _)| k == "Action")
                .map(|(_, v)| v.clone())
                .ok_or_else(|| SqsError::missing("Action"))?;
            let mut input = from_query(&pairs);
            if let (Value::Object(m), Some(url)) = (&mut input, path_queue)
                && !m.contains_key("QueueUrl")
            {
                m.insert("QueueUrl".into(), url.into());
            }
            Ok(Request { action, input })
        }
    }
}

/// A query parameter's name parts, with numbered parts in number order.
#[derive(Debug, Default)]
struct Tree {
    leaf: Option<String>,
    kids: BTreeMap<Part, Tree>,
}

/// One part of a parameter name: numbers sort numerically before names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Index(u64),
    Name(String),
}

impl Tree {
    fn insert(&mut self, path: &str, value: String) {
        let mut node = self;
        for p in path.split('.') {
            let part = match p.parse::<u64>() {
                Ok(n) => Part::Index(n),
                Err(_) => Part::Name(p.to_string()),
            };
            node = node.kids.entry(part).or_default();
        }
        node.leaf = Some(value);
    }

    fn get(&self, name: &str) -> Option<&Tree> {
        self.kids.get(&Part::Name(name.to_string()))
    }

    fn text(&self, name: &str) -> Option<String> {
        self.get(name).and_then(|t| t.leaf.clone())
    }

    /// The numbered children, in order.
    fn items(&self) -> impl Iterator<Item = &Tree> {
        self.kids.iter().filter_map(|(k, v)| match k {
            Part::Index(_) => Some(v),
            Part::Name(_) => None,
        })
    }
}

/// A `Name`/`Value` (or `Key`/`Value`) list as a JSON map.
fn pairs_map(t: &Tree, key: &str, value: impl Fn(&Tree) -> Value) -> Value {
    let mut m = Map::new();
    for item in t.items() {
        if let (Some(k), Some(v)) = (item.text(key), item.get("Value")) {
            m.insert(k, value(v));
        }
    }
    Value::Object(m)
}

/// A numbered list of strings.
fn string_list(t: &Tree) -> Value {
    Value::Array(
        t.items()
            .filter_map(|i| i.leaf.clone().map(Value::String))
            .collect(),
    )
}

/// A message attribute's value: `StringValue`, `BinaryValue`, `DataType`.
fn attribute_value(t: &Tree) -> Value {
    let mut m = Map::new();
    for k in ["StringValue", "BinaryValue", "DataType"] {
        if let Some(v) = t.text(k) {
            m.insert(k.into(), v.into());
        }
    }
    Value::Object(m)
}

/// The JSON members of one level of query parameters.
fn members(t: &Tree) -> Map<String, Value> {
    let mut out = Map::new();
    for (part, kid) in &t.kids {
        let Part::Name(name) = part else { continue };
        let (key, value) = match name.as_str() {
            "Attribute" => (
                "Attributes",
                pairs_map(kid, "Name", |v| v.leaf.clone().unwrap_or_default().into()),
            ),
            "Tag" => (
                "Tags",
                pairs_map(kid, "Key", |v| v.leaf.clone().unwrap_or_default().into()),
            ),
            "MessageAttribute" => ("MessageAttributes", pairs_map(kid, "Name", attribute_value)),
            "MessageSystemAttribute" => (
                "MessageSystemAttributes",
                pairs_map(kid, "Name", attribute_value),
            ),
            "AttributeName" => ("AttributeNames", string_list(kid)),
            "MessageAttributeName" => ("MessageAttributeNames", string_list(kid)),
            "MessageSystemAttributeName" => ("MessageSystemAttributeNames", string_list(kid)),
            "TagKey" => ("TagKeys", string_list(kid)),
            "AWSAccountId" => ("AWSAccountIds", string_list(kid)),
            "ActionName" => ("Actions", string_list(kid)),
            "SendMessageBatchRequestEntry"
            | "DeleteMessageBatchRequestEntry"
            | "ChangeMessageVisibilityBatchRequestEntry" => (
                "Entries",
                Value::Array(kid.items().map(|i| Value::Object(members(i))).collect()),
            ),
            other => match &kid.leaf {
                Some(v) => (other, Value::String(v.clone())),
                None => continue,
            },
        };
        out.insert(key.to_string(), value);
    }
    out
}

/// Query parameters as the JSON protocol's input object.
pub(crate) fn from_query(pairs: &[(String, String)]) -> Value {
    let mut t = Tree::default();
    for (k, v) in pairs {
        if k != "Action" && k != "Version" {
            t.insert(k, v.clone());
        }
    }
    let mut m = members(&t);
    // CreateQueue's tags are `tags` in the JSON protocol.
    if let Some(tags) = m.remove("Tags") {
        m.insert("Tags".into(), tags.clone());
        m.insert("tags".into(), tags);
    }
    Value::Object(m)
}

fn with_request_id(mut r: Response, request_id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        r.headers_mut().insert("x-amzn-requestid", v);
    }
    r
}

fn response(status: u16, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A successful answer carrying `output` (the JSON protocol's output
/// object; empty for actions without one).
pub(crate) fn ok(wire: Wire, action: &str, request_id: &str, output: &Value) -> Response {
    let r = match wire {
        Wire::Json { .. } => response(200, "application/x-amz-json-1.0", output.to_string()),
        Wire::Query => {
            let mut x = String::with_capacity(256);
            x.push_str(&format!("<{action}Response xmlns=\"{XMLNS}\">"));
            if let Value::Object(m) = output
                && !m.is_empty()
            {
                x.push_str(&format!("<{action}Result>"));
                xml_members(&mut x, action, m);
                x.push_str(&format!("</{action}Result>"));
            }
            x.push_str(&format!(
                "<ResponseMetadata><RequestId>{}</RequestId></ResponseMetadata></{action}Response>",
                escape(request_id)
            ));
            response(200, "text/xml", x)
        }
    };
    with_request_id(r, request_id)
}

/// An error answer.
pub(crate) fn error(wire: Wire, request_id: &str, e: &SqsError) -> Response {
    let fault = if e.sender { "Sender" } else { "Receiver" };
    let mut r = match wire {
        Wire::Json { query_mode } => {
            let body = serde_json::json!({
                "__type": format!("com.amazonaws.sqs#{}", e.shape),
                "message": e.message,
            });
            let mut r = response(e.status, "application/x-amz-json-1.0", body.to_string());
            if let Ok(v) = HeaderValue::from_str(&format!("com.amazonaws.sqs#{}", e.shape)) {
                r.headers_mut().insert("x-amzn-errortype", v);
            }
            if query_mode && let Ok(v) = HeaderValue::from_str(&format!("{};{fault}", e.code)) {
                r.headers_mut().insert("x-amzn-query-error", v);
            }
            r
        }
        Wire::Query => response(
            e.status,
            "text/xml",
            format!(
                "<ErrorResponse xmlns=\"{XMLNS}\"><Error><Type>{fault}</Type><Code>{}</Code>\
                 <Message>{}</Message><Detail/></Error><RequestId>{}</RequestId></ErrorResponse>",
                escape(e.code),
                escape(&e.message),
                escape(request_id)
            ),
        ),
    };
    r = with_request_id(r, request_id);
    r
}

/// Text escaped for XML (characters XML 1.0 cannot carry at all are
/// written as character references, which SQS does for `\r`).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
    out
}

/// The element name of the entries of an output list.
fn member_name(action: &str, list: &str) -> &'static str {
    match (action, list) {
        (_, "QueueUrls" | "queueUrls") => "QueueUrl",
        (_, "Messages") => "Message",
        (_, "Failed") => "BatchResultErrorEntry",
        ("ListMessageMoveTasks", "Results") => "ListMessageMoveTasksResultEntry",
        ("SendMessageBatch", "Successful") => "SendMessageBatchResultEntry",
        ("DeleteMessageBatch", "Successful") => "DeleteMessageBatchResultEntry",
        ("ChangeMessageVisibilityBatch", "Successful") => "ChangeMessageVisibilityBatchResultEntry",
        _ => "Results",
    }
}

fn xml_scalar(x: &mut String, name: &str, v: &Value) {
    let text = match v {
        Value::String(s) => escape(s),
        Value::Null => return,
        other => other.to_string(),
    };
    x.push_str(&format!("<{name}>{text}</{name}>"));
}

/// An output object's members as XML elements. Lists and maps are
/// flattened, as SQS's query answers have them.
fn xml_members(x: &mut String, action: &str, m: &Map<String, Value>) {
    for (k, v) in m {
        match (k.as_str(), v) {
            ("Attributes", Value::Object(map)) => {
                for (name, value) in map {
                    x.push_str("<Attribute>");
                    xml_scalar(x, "Name", &Value::String(name.clone()));
                    xml_scalar(x, "Value", value);
                    x.push_str("</Attribute>");
                }
            }
            ("Tags", Value::Object(map)) => {
                for (name, value) in map {
                    x.push_str("<Tag>");
                    xml_scalar(x, "Key", &Value::String(name.clone()));
                    xml_scalar(x, "Value", value);
                    x.push_str("</Tag>");
                }
            }
            ("MessageAttributes", Value::Object(map)) => {
                for (name, value) in map {
                    x.push_str("<MessageAttribute>");
                    xml_scalar(x, "Name", &Value::String(name.clone()));
                    x.push_str("<Value>");
                    if let Value::Object(fields) = value {
                        for (f, fv) in fields {
                            xml_scalar(x, f, fv);
                        }
                    }
                    x.push_str("</Value></MessageAttribute>");
                }
            }
            (list, Value::Array(items)) => {
                let name = member_name(action, list);
                let name = if name == "Results" && action != "ListMessageMoveTasks" {
                    list
                } else {
                    name
                };
                for item in items {
                    match item {
                        Value::Object(fields) => {
                            x.push_str(&format!("<{name}>"));
                            xml_members(x, action, fields);
                            x.push_str(&format!("</{name}>"));
                        }
                        scalar => xml_scalar(x, name, scalar),
                    }
                }
            }
            (name, Value::Object(fields)) => {
                x.push_str(&format!("<{name}>"));
                xml_members(x, action, fields);
                x.push_str(&format!("</{name}>"));
            }
            (name, scalar) => xml_scalar(x, name, scalar),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(q.as_bytes()).into_owned().collect()
    }

    #[test]
    fn query_parameters_become_the_json_members() {
        let v = from_query(&pairs(
            "Action=SendMessageBatch&QueueUrl=http%3A%2F%2Fh%2F1%2Fq\
             &SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=y\
             &SendMessageBatchRequestEntry.10.Id=c&SendMessageBatchRequestEntry.10.MessageBody=z\
             &SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=x\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=n\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=Number\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=5",
        ));
        assert_eq!(
            v,
            serde_json::json!({
                "QueueUrl": "http://h/1/q",
                "Entries": [
                    {"Id": "a", "MessageBody": "x",
                     "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "5"}}},
                    {"Id": "b", "MessageBody": "y"},
                    {"Id": "c", "MessageBody": "z"},
                ]
            })
        );
        let v = from_query(&pairs(
            "Action=CreateQueue&QueueName=q&Attribute.1.Name=DelaySeconds&Attribute.1.Value=5\
             &Tag.1.Key=team&Tag.1.Value=x&AttributeName.1=All",
        ));
        assert_eq!(v["Attributes"], serde_json::json!({"DelaySeconds": "5"}));
        assert_eq!(v["tags"], serde_json::json!({"team": "x"}));
        assert_eq!(v["AttributeNames"], serde_json::json!(["All"]));
    }

    #[test]
    fn outputs_become_sqs_xml() {
        let out = serde_json::json!({
            "Messages": [{"MessageId": "m", "Body": "<a&b>",
                          "Attributes": {"SenderId": "s"},
                          "MessageAttributes": {"n": {"StringValue": "5", "DataType": "Number"}}}]
        });
        let r = ok(Wire::Query, "ReceiveMessage", "rid", &out);
        assert_eq!(r.status(), 200);
        let mut x = String::new();
        xml_members(&mut x, "ReceiveMessage", out.as_object().unwrap());
        assert_eq!(
            x,
            "<Message><Attributes_placeholder/></Message>".replace(
                "<Attributes_placeholder/>",
                "<Attribute><Name>SenderId</Name><Value>s</Value></Attribute>\
                     <Body>&lt;a&amp;b&gt;</Body>\
                     <MessageAttribute><Name>n</Name><Value><DataType>Number</DataType>\
                     <StringValue>5</StringValue></Value></MessageAttribute>\
                     <MessageId>m</MessageId>"
            )
        );
    }
}
