//! What counts as a credential in an inherited environment: names matching the scrub
//! patterns (case-insensitive globs) and values that are URLs carrying a password.

/// Case-insensitive glob match supporting `*`, `?` and `[...]` classes (with `!`/`^`).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    Pattern::new(pattern).matches(&name.to_uppercase())
}

fn match_from(p: &[char], n: &[char]) -> bool {
    // Iterative wildcard matching with single-star backtracking: O(len(p) * len(n)).
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class_match(&p[pi..], n[ni]) {
                        if matched {
                            pi += next;
                            ni += 1;
                            continue;
                        }
                    } else if n[ni] == '[' {
                        pi += 1;
                        ni += 1;
                        continue;
                    }
                }
                c if c == n[ni] => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                pi = sp + 1;
                ni = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class starting at `p[0] == '['`; returns (matched, class length),
/// or None when the class is unterminated (then `[` is literal).
fn class_match(p: &[char], c: char) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < p.len() {
        if p[i] == ']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            if p[i] <= c && c <= p[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if p[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
}

/// Ordered map with last-writer-wins semantics that keeps first-insertion order.
/// One environment entry as raw bytes: names and values need not be UTF-8.
/// Whether `value` contains a URL whose authority carries a password
/// (`scheme://user:password@host…`, e.g. `postgres://u:p@h/db`); several URLs may appear
/// (space-separated index lists), each is checked.
pub fn has_url_password(value: &[u8]) -> bool {
    let mut from = 0;
    while let Some(pos) = find(&value[from..], b"://") {
        let sep = from + pos;
        let scheme_start = value[..sep]
            .iter()
            .rposition(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.')))
            .map_or(0, |i| i + 1);
        let scheme = &value[scheme_start..sep];
        let authority_start = sep + 3;
        let rest = &value[authority_start..];
        let end = rest
            .iter()
            .position(|&c| matches!(c, b'/' | b'?' | b'#') || c.is_ascii_whitespace())
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        if scheme.first().is_some_and(|c| c.is_ascii_alphabetic()) {
            if raw_password(rest) {
                return true;
            }
            if let Some(at) = authority.iter().rposition(|&c| c == b'@') {
                let userinfo = &authority[..at];
                if let Some(colon) = userinfo.iter().position(|&c| c == b':') {
                    if colon + 1 < userinfo.len() {
                        return true;
                    }
                }
            }
        }
        from = authority_start;
    }
    false
}

/// A password typed without percent-encoding after `scheme://` (`postgres://u:pa/ss@h`,
/// `redis://:p#w@h`, which SQLAlchemy-style parsers accept): the user part has no `/`, `?`,
/// `#` or `@`, the text after its colon reaches an `@` before any whitespace, and that text
/// is not a port followed by a path (`http://host:8080/@user` keeps its value).
fn raw_password(rest: &[u8]) -> bool {
    let end = rest
        .iter()
        .position(|c| c.is_ascii_whitespace())
        .unwrap_or(rest.len());
    let rest = &rest[..end];
    let Some(colon) = rest
        .iter()
        .position(|&c| matches!(c, b':' | b'/' | b'?' | b'#' | b'@'))
    else {
        return false;
    };
    if rest[colon] != b':' {
        return false;
    }
    let after = &rest[colon + 1..];
    let Some(at) = after.iter().position(|&c| c == b'@') else {
        return false;
    };
    let password = &after[..at];
    let digits = password.iter().take_while(|c| c.is_ascii_digit()).count();
    let port_then_path = digits > 0 && matches!(password.get(digits), Some(b'/' | b'?' | b'#'));
    !password.is_empty() && !port_then_path
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A compiled scrub pattern: `*LITERAL*` (the common shape) is a substring test, anything
/// else goes through the glob matcher. Patterns are upper-cased once, up front.
pub(crate) enum Pattern {
    Contains(String),
    Glob(Vec<char>),
}

impl Pattern {
    pub(crate) fn new(pattern: &str) -> Self {
        let upper = pattern.to_uppercase();
        let inner = upper
            .strip_prefix('*')
            .and_then(|rest| rest.strip_suffix('*'));
        match inner {
            Some(lit) if !lit.is_empty() && !lit.contains(['*', '?', '[']) => {
                Self::Contains(lit.to_string())
            }
            _ => Self::Glob(upper.chars().collect()),
        }
    }

    /// `name` must already be upper-cased.
    pub(crate) fn matches(&self, name: &str) -> bool {
        match self {
            Self::Contains(lit) => name.contains(lit.as_str()),
            Self::Glob(glob) => {
                let n: Vec<char> = name.chars().collect();
                match_from(glob, &n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_is_case_insensitive() {
        assert!(glob_match("*KEY*", "openai_api_key"));
        assert!(glob_match("*TOKEN*", "GITHUB_TOKEN"));
        assert!(!glob_match("*KEY*", "PATH"));
        assert!(glob_match("A?C", "abc"));
        assert!(glob_match("[a-c]x", "Bx"));
        assert!(!glob_match("[!a-c]x", "bx"));
        assert!(glob_match("*", ""));
    }

    #[test]
    fn url_passwords_are_credentials_whatever_the_name() {
        for v in [
            "postgres://u:p@h/db",
            "https://user:tok@pypi.example/simple",
            "a https://x.org b redis://:secret@cache:6379",
            "mysql://root:pw@localhost",
            // Unencoded passwords (red team): each leaked before.
            "postgres://user:pa/ss@db/x",
            "redis://:p#ss@h:6379",
            "amqp://u:p?x@h",
        ] {
            assert!(has_url_password(v.as_bytes()), "{v}");
        }
        for v in [
            "https://example.org/a:b@c",
            "ssh://git@github.com/x",
            "http://user:@host/",
            "no url at all",
            "://x:y@z",
            "x@y:z",
            "http://host:8080/@user",
            "http://localhost:8080/path",
            "https://example.org/?next=a:b",
            "https://u@h/a:b@c",
        ] {
            assert!(!has_url_password(v.as_bytes()), "{v}");
        }
    }
}
