// `${NAME}` in the configuration file: replaced by the environment variable's value before the
// YAML is parsed, so secrets and per-host values stay out of the file; `$${` writes a literal `${`.
//
// Full-line comments are left alone. A variable that is unset, not UTF-8 or holds a line break
// is an error naming it and its line. Values are inserted as written: quote the scalar in the
// YAML (`key: "${SECRET}"`) when a value may contain YAML syntax such as `: ` or `#`.

use std::env::VarError;

/// Why expansion failed, on which (1-based) line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandError {
    pub line: usize,
    pub message: String,
}

/// The values `${NAME}`s were replaced by, kept to take them back out of error messages: a
/// configuration error shows `${NAME}`, never a secret the environment held. Shown by name only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvValues(Vec<(String, String)>);

impl std::fmt::Debug for EnvValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Values shorter than this are left in messages (too short to be a secret, too common to
/// replace without garbling the message).
const MIN_HIDDEN_LEN: usize = 4;

impl EnvValues {
    /// `message` with every expanded value written back as its `${NAME}`.
    pub fn hide(&self, message: &str) -> String {
        let mut values: Vec<&(String, String)> = self
            .0
            .iter()
            .filter(|(_, v)| v.len() >= MIN_HIDDEN_LEN)
            .collect();
        // Longest first: a value inside another is replaced after it.
        values.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let mut out = message.to_string();
        for (name, value) in values {
            out = out.replace(value.as_str(), &format!("${{{name}}}"));
        }
        out
    }
}

/// Expand `text` with values from the process environment.
pub fn expand_env(text: &str) -> Result<(String, EnvValues), ExpandError> {
    expand(text, |name| std::env::var(name))
}

/// Expand `text`, looking each name up with `lookup`; also the values put in.
pub fn expand(
    text: &str,
    lookup: impl Fn(&str) -> Result<String, VarError>,
) -> Result<(String, EnvValues), ExpandError> {
    let mut used = EnvValues::default();
    if !text.contains('$') {
        return Ok((text.to_string(), used));
    }
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let err = |message: String| ExpandError {
            line: i + 1,
            message,
        };
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + 1..];
            if let Some(a) = after.strip_prefix("${") {
                out.push_str("${");
                rest = a;
            } else if let Some(a) = after.strip_prefix('{') {
                let end = a
                    .find('}')
                    .ok_or_else(|| err("`${` without a closing `}`".to_string()))?;
                let name = &a[..end];
                if !valid_name(name) {
                    return Err(err(format!(
                        "${{{name}}}: not an environment variable name (letters, digits and _, not starting with a digit); write $${{ for a literal ${{"
                    )));
                }
                let value = match lookup(name) {
                    Ok(v) => v,
                    Err(VarError::NotPresent) => {
                        return Err(err(format!("environment variable {name} is not set")));
                    }
                    Err(VarError::NotUnicode(_)) => {
                        return Err(err(format!(
                            "environment variable {name} is not valid UTF-8"
                        )));
                    }
                };
                if value.contains(['\n', '\r']) {
                    return Err(err(format!(
                        "environment variable {name} contains a line break"
                    )));
                }
                out.push_str(&value);
                used.0.push((name.to_string(), value));
                rest = &a[end + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
    }
    Ok((out, used))
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Result<String, VarError> {
        match name {
            "TOKEN_FILE" => Ok("/run/secrets/tokens".into()),
            "NODE" => Ok("gpu-7".into()),
            "EMPTY" => Ok(String::new()),
            "MULTI" => Ok("a\nb".into()),
            _ => Err(VarError::NotPresent),
        }
    }

    #[test]
    fn replaces_variables_and_keeps_everything_else() {
        let text = "auth:\n  tokens_file: ${TOKEN_FILE}\ngpu:\n  instance: \"${NODE}-${NODE}\"\nx: a$b $ $$ ${EMPTY}end\ny: $${NOT_EXPANDED}\n";
        let out = expand(text, env).unwrap().0;
        assert_eq!(
            out,
            "auth:\n  tokens_file: /run/secrets/tokens\ngpu:\n  instance: \"gpu-7-gpu-7\"\nx: a$b $ $$ end\ny: ${NOT_EXPANDED}\n"
        );
        assert_eq!(
            expand("no variables: $5\n", env).unwrap().0,
            "no variables: $5\n"
        );
        assert_eq!(
            expand("a: ${NODE}", env).unwrap().0,
            "a: gpu-7",
            "no final newline"
        );
    }

    #[test]
    fn comment_lines_are_not_expanded() {
        let text = "# set ${UNSET} to …\n  # ${ALSO_UNSET}\na: 1\n";
        assert_eq!(expand(text, env).unwrap().0, text);
    }

    #[test]
    fn errors_name_the_variable_and_line() {
        let e = expand("a: 1\nb: ${NODE}\nc: ${MISSING_VAR}\n", env).unwrap_err();
        assert_eq!(e.line, 3);
        assert!(
            e.message.contains("MISSING_VAR") && e.message.contains("not set"),
            "{e:?}"
        );
        let e = expand("a: ${MULTI}\n", env).unwrap_err();
        assert!(
            e.line == 1 && e.message.contains("MULTI") && e.message.contains("line break"),
            "{e:?}"
        );
        let e = expand("x: 1\na: ${NODE\n", env).unwrap_err();
        assert!(e.line == 2 && e.message.contains("closing"), "{e:?}");
        for bad in ["${}", "${1A}", "${A-B}", "${A:-x}"] {
            let e = expand(bad, env).unwrap_err();
            assert!(
                e.message.contains("not an environment variable name"),
                "{bad}: {e:?}"
            );
        }
        let e = expand("a: ${N}\n", |_| {
            Err(VarError::NotUnicode("\u{fffd}".into()))
        })
        .unwrap_err();
        assert!(e.message.contains("not valid UTF-8"), "{e:?}");
    }

    #[test]
    fn expanded_values_are_taken_back_out_of_messages() {
        let (_, used) = expand("a: ${TOKEN_FILE}\nb: ${NODE}\n", env).unwrap();
        assert_eq!(
            used.hide("key a: /run/secrets/tokens is not readable; node gpu-7"),
            "key a: ${TOKEN_FILE} is not readable; node ${NODE}"
        );
        assert_eq!(format!("{used:?}"), r#"["TOKEN_FILE", "NODE"]"#);
    }
}
