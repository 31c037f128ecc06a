// Sharded collectors: which scrape targets this instance owns when N instances split a fleet,
// by the hash Prometheus `hashmod` relabeling computes over `__address__` (same split, same tool).

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use std::fmt;

/// `scrape.shard`: this instance scrapes only the targets whose address hashes to `index`
/// modulo `count`.
///
/// The split equals this Prometheus relabeling (so either side can take over a shard):
///
/// ```yaml
/// relabel_configs:
///   - {source_labels: [__address__], modulus: 2, target_label: __tmp_hash, action: hashmod}
///   - {source_labels: [__tmp_hash], regex: "0", action: keep}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// This instance's shard, `0..count`.
    pub index: u64,
    /// How many instances split the targets.
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("{0:?} is not a shard: expected INDEX/COUNT, e.g. 0/2")]
    Syntax(String),
    #[error("count must be at least 1")]
    ZeroCount,
    #[error("index {index} is out of range for count {count}: shards are numbered 0 to {last}", last = count - 1)]
    IndexOutOfRange { index: u64, count: u64 },
}

impl ShardConfig {
    /// Checks `index < count` (and `count >= 1`).
    pub fn check(&self) -> Result<(), ShardError> {
        if self.count == 0 {
            return Err(ShardError::ZeroCount);
        }
        if self.index >= self.count {
            return Err(ShardError::IndexOutOfRange {
                index: self.index,
                count: self.count,
            });
        }
        Ok(())
    }

    /// Parses `--shard I/N`, checked.
    pub fn parse(s: &str) -> Result<ShardConfig, ShardError> {
        let syntax = || ShardError::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(syntax)?;
        let index: u64 = i.trim().parse().map_err(|_| syntax())?;
        let count: u64 = n.trim().parse().map_err(|_| syntax())?;
        let shard = ShardConfig { index, count };
        shard.check()?;
        Ok(shard)
    }

    /// The shard a target address (`host:port`) belongs to.
    pub fn shard_of(&self, address: &str) -> u64 {
        hashmod(address, self.count.max(1))
    }

    pub fn owns(&self, address: &str) -> bool {
        self.shard_of(address) == self.index
    }
}

impl fmt::Display for ShardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Prometheus `hashmod`: the low 8 bytes of the MD5 of `value`, big-endian, modulo `modulus`
/// (`binary.BigEndian.Uint64(md5.Sum(val)[8:]) % modulus` in Prometheus' relabel.go).
pub fn hashmod(value: &str, modulus: u64) -> u64 {
    let digest = Md5::digest(value.as_bytes());
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[8..16]);
    u64::from_be_bytes(low) % modulus.max(1)
}

/// The `__address__` Prometheus would hash for a scrape URL: `host:port` as written, without
/// scheme, user info or path.
pub fn address(uri: &http::Uri) -> String {
    match uri.authority() {
        Some(a) => match a.port() {
            Some(p) => format!("{}:{}", a.host(), p.as_str()),
            None => a.host().to_string(),
        },
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashmod_matches_prometheus() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e: low 8 bytes 0xe9800998ecf8427e.
        // Below u64::MAX, so `% u64::MAX` leaves it as it is.
        assert_eq!(hashmod("", u64::MAX), 0xe980_0998_ecf8_427e);
        assert_eq!(hashmod("", 7), 0xe980_0998_ecf8_427e_u64 % 7);
        // MD5("127.0.0.1:9090") = 570b800bb566b84e d19b6586d4822cee (Python's hashlib).
        assert_eq!(hashmod("127.0.0.1:9090", u64::MAX), 0xd19b_6586_d482_2cee);
        assert_eq!(hashmod("127.0.0.1:9090", 2), 0);
        assert_eq!(hashmod("127.0.0.1:9090", 3), 2);
        assert_eq!(hashmod("anything", 1), 0);
    }

    #[test]
    fn shards_parse_and_check() {
        assert_eq!(
            ShardConfig::parse("1/3"),
            Ok(ShardConfig { index: 1, count: 3 })
        );
        assert_eq!(
            ShardConfig::parse(" 0 / 1 ").map(|s| s.to_string()),
            Ok("0/1".into())
        );
        assert!(matches!(
            ShardConfig::parse("2"),
            Err(ShardError::Syntax(_))
        ));
        assert!(matches!(
            ShardConfig::parse("a/2"),
            Err(ShardError::Syntax(_))
        ));
        assert!(matches!(
            ShardConfig::parse("-1/2"),
            Err(ShardError::Syntax(_))
        ));
        assert_eq!(ShardConfig::parse("0/0"), Err(ShardError::ZeroCount));
        let e = ShardConfig::parse("2/2").unwrap_err();
        assert_eq!(
            e.to_string(),
            "index 2 is out of range for count 2: shards are numbered 0 to 1"
        );
    }

    #[test]
    fn every_address_has_exactly_one_owner() {
        let shards: Vec<ShardConfig> = (0..3)
            .map(|index| ShardConfig { index, count: 3 })
            .collect();
        let mut per_shard = [0usize; 3];
        for port in 8000..8060 {
            let a = format!("127.0.0.1:{port}");
            let owners: Vec<u64> = shards
                .iter()
                .filter(|s| s.owns(&a))
                .map(|s| s.index)
                .collect();
            assert_eq!(owners.len(), 1, "{a}: {owners:?}");
            per_shard[owners[0] as usize] += 1;
        }
        assert!(per_shard.iter().all(|n| *n > 5), "{per_shard:?}");
    }

    #[test]
    fn config_key_is_checked_and_named() {
        use crate::config::Config;
        let c = Config::from_yaml("scrape:\n  shard: {index: 1, count: 2}\n", "c.yaml").unwrap();
        assert_eq!(c.scrape.shard, Some(ShardConfig { index: 1, count: 2 }));
        let err = Config::from_yaml("scrape:\n  shard: {index: 2, count: 2}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("c.yaml") && err.contains("scrape.shard.index") && err.contains("0 to 1"),
            "{err}"
        );
        let err = Config::from_yaml("scrape:\n  shard: {index: 0, count: 0}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("scrape.shard.count"), "{err}");
        let err = Config::from_yaml("scrape:\n  shard: {index: 0, cnt: 2}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("scrape.shard") && err.contains("cnt"), "{err}");
    }

    #[test]
    fn address_is_host_and_port() {
        let u: http::Uri = "http://user:pw@10.0.0.1:8000/metrics?x=1".parse().unwrap();
        assert_eq!(address(&u), "10.0.0.1:8000");
        let u: http::Uri = "http://[::1]:9400/metrics".parse().unwrap();
        assert_eq!(address(&u), "[::1]:9400");
        let u: http::Uri = "http://gpu-exporter/metrics".parse().unwrap();
        assert_eq!(address(&u), "gpu-exporter");
    }
}
