// Values placed in URLs: one percent-encoding of a path segment or query value (alert links,
// runbook templates), on the percent-encoding crate.

/// Characters kept as they are in a URL component: RFC 3986's unreserved ones.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `v` percent-encoded as one URL path segment or query value.
pub fn component(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn unreserved_characters_stay_and_the_rest_is_encoded() {
        assert_eq!(super::component("a/1 b~c.d_e-f"), "a%2F1%20b~c.d_e-f");
        assert_eq!(super::component("é"), "%C3%A9");
    }
}
