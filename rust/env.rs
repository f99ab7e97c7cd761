//! The child's environment: the harness's, scrubbed of credentials and managed names, plus
//! the caller's layers in a fixed order (later layers win).

use std::collections::HashMap;

/// Case-insensitive glob match supporting `*`, `?` and `[...]` classes (with `!`/`^`).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.to_uppercase().chars().collect();
    let n: Vec<char> = name.to_uppercase().chars().collect();
    match_from(&p, &n)
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
pub type EnvPair = (Vec<u8>, Vec<u8>);

#[derive(Default)]
struct EnvMap {
    order: Vec<Vec<u8>>,
    values: HashMap<Vec<u8>, Vec<u8>>,
}

impl EnvMap {
    fn set(&mut self, key: &[u8], value: &[u8]) {
        if self.values.insert(key.to_vec(), value.to_vec()).is_none() {
            self.order.push(key.to_vec());
        }
    }

    fn into_vec(self) -> Vec<EnvPair> {
        let EnvMap { order, mut values } = self;
        order
            .into_iter()
            .filter_map(|k| values.remove(&k).map(|v| (k, v)))
            .collect()
    }
}

/// The layers of one child environment, applied in this order.
pub struct EnvLayers<'a> {
    /// The harness's environment at spawn time.
    pub base: &'a [EnvPair],
    /// Names matching any of these (case-insensitive) are removed from `base`.
    pub scrub_patterns: &'a [String],
    /// Every `base` name with this prefix is removed; caller `extra` names with it are ignored.
    pub managed_prefix: &'a str,
    /// Terminal settings for a model-readable result (NO_COLOR, TERM=dumb, ...).
    pub terminal: &'a [EnvPair],
    /// The caller's ordinary extra env (wins over everything above).
    pub extra: &'a [EnvPair],
    /// Managed (`DSH_*`) facts, merged last.
    pub managed: &'a [EnvPair],
}

pub fn build_env(layers: &EnvLayers<'_>) -> Vec<EnvPair> {
    let mut env = EnvMap::default();
    let prefix = layers.managed_prefix.as_bytes();
    for (k, v) in layers.base {
        let name = String::from_utf8_lossy(k);
        let scrubbed = layers.scrub_patterns.iter().any(|p| glob_match(p, &name));
        let managed = !prefix.is_empty() && k.starts_with(prefix);
        if !scrubbed && !managed {
            env.set(k, v);
        }
    }
    for (k, v) in layers.terminal {
        env.set(k, v);
    }
    for (k, v) in layers.extra {
        if prefix.is_empty() || !k.starts_with(prefix) {
            env.set(k, v);
        }
    }
    for (k, v) in layers.managed {
        env.set(k, v);
    }
    env.into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<EnvPair> {
        items
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

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
    fn layers_apply_in_order() {
        let base = pairs(&[
            ("PATH", "/bin"),
            ("API_KEY", "secret"),
            ("DSH_HOME", "stale"),
        ]);
        let patterns = vec!["*KEY*".to_string()];
        let terminal = pairs(&[("TERM", "dumb")]);
        let extra = pairs(&[("API_KEY", "mine"), ("DSH_SESSION_ID", "forged")]);
        let managed = pairs(&[("DSH_HOME", "/h")]);
        let env = build_env(&EnvLayers {
            base: &base,
            scrub_patterns: &patterns,
            managed_prefix: "DSH_",
            terminal: &terminal,
            extra: &extra,
            managed: &managed,
        });
        assert_eq!(
            env,
            pairs(&[
                ("PATH", "/bin"),
                ("TERM", "dumb"),
                ("API_KEY", "mine"),
                ("DSH_HOME", "/h")
            ])
        );
    }
}
