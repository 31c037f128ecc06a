// OTLP/HTTP payloads: content type and encoding checks, bounded gzip inflation, protobuf and
// OTLP/JSON decoding with errors naming what was wrong, and responses in the request's encoding.

use serde::{Serialize, de::DeserializeOwned};
use std::io::Read;

/// How a payload is encoded (`Content-Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Protobuf => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

/// Why a payload was refused; `status()` is the HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "unsupported content type {0:?}: OTLP/HTTP takes application/x-protobuf or application/json"
    )]
    ContentType(String),
    #[error("unsupported content encoding {0:?}: OTLP/HTTP takes gzip or no encoding")]
    ContentEncoding(String),
    #[error("request body is larger than the limit of {limit} bytes (otlp.max_request_bytes)")]
    TooLarge { limit: usize },
    #[error("cannot read the request body: {0}")]
    Body(String),
    #[error("Content-Encoding is gzip but the body is not valid gzip: {0}")]
    Gzip(String),
    #[error("invalid OTLP protobuf {what}: {error}")]
    Protobuf { what: &'static str, error: String },
    #[error("invalid OTLP/JSON {what}: {error}")]
    Json { what: &'static str, error: String },
    #[error(
        "tokenwatch holds {held} bytes of OTLP request bodies being received, and this one would go over limits.max_buffered_body_bytes ({limit}); retry shortly"
    )]
    OverBudget { held: usize, limit: usize },
    #[error(
        "the request body did not arrive within otlp.body_read_timeout ({timeout_ms} ms); a slow upload does not hold the receiver"
    )]
    SlowBody { timeout_ms: u64 },
}

impl DecodeError {
    pub fn status(&self) -> u16 {
        match self {
            DecodeError::ContentType(_) | DecodeError::ContentEncoding(_) => 415,
            DecodeError::TooLarge { .. } => 413,
            DecodeError::OverBudget { .. } => 503,
            DecodeError::SlowBody { .. } => 408,
            _ => 400,
        }
    }

    /// The `google.rpc.Status` code of the answer.
    pub fn code(&self) -> tonic::Code {
        match self.status() {
            503 => tonic::Code::Unavailable,
            408 => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::InvalidArgument,
        }
    }

    /// Label for the `reason` of `tokenwatch_otlp_requests`.
    pub fn outcome(&self) -> &'static str {
        match self.status() {
            415 => "unsupported_media_type",
            413 => "too_large",
            503 => "over_budget",
            408 => "body_timeout",
            _ => "bad_request",
        }
    }
}

/// The encoding named by a `Content-Type` header (parameters such as `charset` ignored).
pub fn encoding_of(content_type: Option<&str>) -> Result<Encoding, DecodeError> {
    let ct = content_type.unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/x-protobuf" | "application/protobuf" => Ok(Encoding::Protobuf),
        "application/json" => Ok(Encoding::Json),
        _ => Err(DecodeError::ContentType(ct.to_string())),
    }
}

/// Whether a `Content-Encoding` header asks for gzip (`None`/`identity`: no).
pub fn is_gzip(content_encoding: Option<&str>) -> Result<bool, DecodeError> {
    match content_encoding
        .map(|s| s.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => Ok(false),
        Some("gzip") | Some("x-gzip") => Ok(true),
        Some(_) => Err(DecodeError::ContentEncoding(
            content_encoding.unwrap_or("").to_string(),
        )),
    }
}

/// Inflate a gzip body, refusing output over `limit` bytes (no unbounded buffering).
pub fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    let mut reader = flate2::read::MultiGzDecoder::new(body).take(limit as u64 + 1);
    reader
        .read_to_end(&mut out)
        .map_err(|e| DecodeError::Gzip(e.to_string()))?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge { limit });
    }
    Ok(out)
}

/// Decode one export request. `what` names the message in errors.
pub fn decode<T>(bytes: &[u8], enc: Encoding, what: &'static str) -> Result<T, DecodeError>
where
    T: prost::Message + Default + DeserializeOwned,
{
    match enc {
        Encoding::Protobuf => T::decode(bytes).map_err(|e| DecodeError::Protobuf {
            what,
            error: e.to_string(),
        }),
        Encoding::Json => {
            let mut de = serde_json::Deserializer::from_slice(bytes);
            let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let path = e.path().to_string();
                DecodeError::Json {
                    what,
                    error: format!("at {path}: {}", e.into_inner()),
                }
            })?;
            de.end().map_err(|e| DecodeError::Json {
                what,
                error: e.to_string(),
            })?;
            Ok(value)
        }
    }
}

/// Encode a response in the request's encoding.
pub fn encode<T: prost::Message + Serialize>(msg: &T, enc: Encoding) -> Vec<u8> {
    match enc {
        Encoding::Protobuf => msg.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// `google.rpc.Status`, the body of OTLP/HTTP error answers.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The body of an error answer: a `Status` in the request's encoding (JSON when unknown).
pub fn error_body(
    code: tonic::Code,
    message: &str,
    enc: Option<Encoding>,
) -> (Vec<u8>, &'static str) {
    let status = RpcStatus {
        code: code as i32,
        message: message.to_string(),
    };
    let enc = enc.unwrap_or(Encoding::Json);
    (encode(&status, enc), enc.content_type())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn content_types_and_encodings() {
        assert_eq!(
            encoding_of(Some("application/json; charset=utf-8")),
            Ok(Encoding::Json)
        );
        assert_eq!(
            encoding_of(Some("application/x-protobuf")),
            Ok(Encoding::Protobuf)
        );
        assert_eq!(encoding_of(Some("text/plain")).unwrap_err().status(), 415);
        assert_eq!(encoding_of(None).unwrap_err().status(), 415);
        assert_eq!(is_gzip(Some("gzip")), Ok(true));
        assert_eq!(is_gzip(None), Ok(false));
        assert_eq!(is_gzip(Some("br")).unwrap_err().status(), 415);
    }

    #[test]
    fn gzip_is_bounded_and_garbage_is_an_error() {
        assert_eq!(gunzip(&gz(b"hello"), 10).unwrap(), b"hello");
        assert_eq!(
            gunzip(&gz(&[0u8; 1000]), 999).unwrap_err(),
            DecodeError::TooLarge { limit: 999 }
        );
        let e = gunzip(b"not gzip at all", 100).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().contains("not valid gzip"), "{e}");
    }

    #[test]
    fn json_uses_hex_ids_and_camel_case_and_errors_name_the_path() {
        let json = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c",
            "spanId":"eee19b7ec3c1b174","name":"chat m","startTimeUnixNano":"1544712660000000000",
            "endTimeUnixNano":"1544712661000000000","kind":3,
            "attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":"12"}}]}]}]}]}"#;
        let r: ExportTraceServiceRequest =
            decode(json.as_bytes(), Encoding::Json, "ExportTraceServiceRequest").unwrap();
        let span = &r.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(
            hex::encode(&span.trace_id),
            "5b8efff798038103d269b633813fc60c"
        );
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        let bad = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":5}]}]}]}"#;
        let e = decode::<ExportTraceServiceRequest>(
            bad.as_bytes(),
            Encoding::Json,
            "ExportTraceServiceRequest",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("resourceSpans[0].scopeSpans[0].spans[0].name"),
            "{e}"
        );
        let e = decode::<ExportTraceServiceRequest>(
            &[0x0a, 0x05, 0x01],
            Encoding::Protobuf,
            "ExportTraceServiceRequest",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid OTLP protobuf ExportTraceServiceRequest"),
            "{e}"
        );
    }
}
