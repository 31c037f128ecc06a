// Query-string checking for the API routes (of every stage): only known parameter names, each at most once, and
// typed values whose errors say which parameter was wrong and what it accepts.

use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParamError {
    #[error("unknown query parameter {name:?}; allowed: {allowed}")]
    Unknown { name: String, allowed: String },
    #[error("query parameter {name:?} given more than once")]
    Repeated { name: String },
    #[error("invalid value {value:?} for {name:?}; allowed: {allowed}")]
    BadValue {
        name: String,
        value: String,
        allowed: String,
    },
    #[error("the query string is not valid: {0}")]
    Malformed(String),
}

pub struct Params {
    values: HashMap<String, String>,
}

impl Params {
    pub fn parse(query: Option<&str>, allowed: &[&str]) -> Result<Params, ParamError> {
        let pairs: Vec<(String, String)> = match query {
            None | Some("") => Vec::new(),
            Some(q) => {
                serde_urlencoded::from_str(q).map_err(|e| ParamError::Malformed(e.to_string()))?
            }
        };
        let mut values = HashMap::new();
        for (k, v) in pairs {
            if !allowed.contains(&k.as_str()) {
                return Err(ParamError::Unknown {
                    name: k,
                    allowed: allowed.join(", "),
                });
            }
            if values.insert(k.clone(), v).is_some() {
                return Err(ParamError::Repeated { name: k });
            }
        }
        Ok(Params { values })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn parse_with<T>(
        &self,
        name: &str,
        f: impl Fn(&str) -> Option<T>,
        allowed: &str,
    ) -> Result<Option<T>, ParamError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| ParamError::BadValue {
                name: name.into(),
                value: v.into(),
                allowed: allowed.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_and_repeated() {
        let e = Params::parse(Some("model=a&windw=5m"), &["model", "window"])
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("windw") && e.to_string().contains("allowed: model, window")
        );
        assert!(matches!(
            Params::parse(Some("model=a&model=b"), &["model"]),
            Err(ParamError::Repeated { .. })
        ));
        let p = Params::parse(Some("window=2m"), &["window"]).unwrap();
        let e = p
            .parse_with("window", |s| (s == "5m").then_some(5), "1m, 5m, 1h")
            .unwrap_err();
        assert!(e.to_string().contains("\"2m\"") && e.to_string().contains("1m, 5m, 1h"));
    }
}
