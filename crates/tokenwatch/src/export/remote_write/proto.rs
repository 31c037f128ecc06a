// The remote-write 1.0 wire format: the four protobuf messages a sender needs, and a request's
// body as sent (protobuf, then snappy's block format — not its framed stream format).

//! Field numbers are those of prometheus/prompb: `remote.proto` (`WriteRequest.timeseries = 1`;
//! 2 is reserved and `metadata = 3` is not sent) and `types.proto` (`TimeSeries.labels = 1`,
//! `samples = 2`; `Label.name = 1`, `value = 2`; `Sample.value = 1` (double),
//! `timestamp = 2` (int64, milliseconds since the epoch)). Defined here with prost's derive:
//! four small messages do not need protoc or a build script.

/// `prometheus.WriteRequest`: one remote-write request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`: labels sorted by name (`__name__` among them), then samples
/// oldest first.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

impl WriteRequest {
    /// The HTTP body: the protobuf encoding, snappy-compressed (block format).
    pub fn to_body(&self) -> Result<Vec<u8>, snap::Error> {
        let raw = prost::Message::encode_to_vec(self);
        snap::raw::Encoder::new().compress_vec(&raw)
    }

    /// Samples in the request (what the remote-write counters count).
    pub fn sample_count(&self) -> usize {
        self.timeseries.iter().map(|t| t.samples.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn body_round_trips_through_snappy_and_protobuf() {
        let req = WriteRequest {
            timeseries: vec![
                TimeSeries {
                    labels: vec![
                        Label {
                            name: "__name__".into(),
                            value: "up".into(),
                        },
                        Label {
                            name: "job".into(),
                            value: "tokenwatch".into(),
                        },
                    ],
                    samples: vec![Sample {
                        value: 1.0,
                        timestamp: 1_700_000_000_123,
                    }],
                },
                TimeSeries {
                    labels: vec![Label {
                        name: "__name__".into(),
                        value: "x_bucket".into(),
                    }],
                    samples: vec![Sample {
                        value: f64::INFINITY,
                        timestamp: -5,
                    }],
                },
            ],
        };
        let body = req.to_body().unwrap();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        assert_eq!(WriteRequest::decode(raw.as_slice()).unwrap(), req);
        assert_eq!(req.sample_count(), 2);
    }

    #[test]
    fn field_numbers_match_prompb() {
        // Label{name: "a", value: "b"}: field 1 (len-delimited) "a", field 2 "b".
        let label = Label {
            name: "a".into(),
            value: "b".into(),
        }
        .encode_to_vec();
        assert_eq!(label, [0x0a, 1, b'a', 0x12, 1, b'b']);
        // Sample{value: 1.0, timestamp: 2}: field 1 fixed64, field 2 varint.
        let sample = Sample {
            value: 1.0,
            timestamp: 2,
        }
        .encode_to_vec();
        assert_eq!(sample[0], 0x09);
        assert_eq!(&sample[1..9], &1.0f64.to_le_bytes());
        assert_eq!(&sample[9..], &[0x10, 2]);
        // WriteRequest.timeseries = 1, TimeSeries.labels = 1, TimeSeries.samples = 2.
        let ts = TimeSeries {
            labels: vec![],
            samples: vec![Sample {
                value: 0.0,
                timestamp: 1,
            }],
        };
        let req = WriteRequest {
            timeseries: vec![ts],
        }
        .encode_to_vec();
        assert_eq!(req[0], 0x0a);
        assert_eq!(req[2], 0x12);
    }
}
