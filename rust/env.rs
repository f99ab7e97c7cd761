//! The child's environment: the harness's, scrubbed of credentials and managed names, plus
//! the caller's layers in a fixed order (later layers win).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use crate::errors::CoreError;

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

/// A compiled scrub pattern: `*LITERAL*` (the common shape) is a substring test, anything
/// else goes through the glob matcher. Patterns are upper-cased once, up front.
enum Pattern {
    Contains(String),
    Glob(Vec<char>),
}

impl Pattern {
    fn new(pattern: &str) -> Self {
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
    fn matches(&self, name: &str) -> bool {
        match self {
            Self::Contains(lit) => name.contains(lit.as_str()),
            Self::Glob(glob) => {
                let n: Vec<char> = name.chars().collect();
                match_from(glob, &n)
            }
        }
    }
}

/// An executor's fixed environment rules; `build` applies them to one call's layers:
/// the harness's environment minus scrubbed, dropped and managed-prefix names, then the
/// terminal settings, then the caller's `extra` (managed-prefix names ignored), then the
/// managed facts last. Later layers win.
pub struct EnvPolicy {
    patterns: Vec<Pattern>,
    prefix: Vec<u8>,
    drop_names: Vec<Vec<u8>>,
    terminal: Vec<EnvPair>,
}

impl EnvPolicy {
    pub fn new(
        scrub_patterns: &[String],
        managed_prefix: &str,
        drop_names: Vec<Vec<u8>>,
        terminal: Vec<EnvPair>,
    ) -> Self {
        Self {
            patterns: scrub_patterns.iter().map(|p| Pattern::new(p)).collect(),
            prefix: managed_prefix.as_bytes().to_vec(),
            drop_names,
            terminal,
        }
    }

    fn is_managed(&self, name: &[u8]) -> bool {
        !self.prefix.is_empty() && name.starts_with(&self.prefix)
    }

    /// Whether an inherited variable reaches the child.
    pub fn keeps(&self, name: &[u8]) -> bool {
        if self.is_managed(name) || self.drop_names.iter().any(|d| d == name) {
            return false;
        }
        let upper = String::from_utf8_lossy(name).to_uppercase();
        !self.patterns.iter().any(|p| p.matches(&upper))
    }

    /// The inherited layer: `base` without the names this policy removes.
    pub fn kept_base(&self, base: &[EnvPair]) -> Vec<EnvPair> {
        base.iter()
            .filter(|(k, _)| self.keeps(k))
            .cloned()
            .collect()
    }

    /// The complete environment from an already filtered inherited layer.
    pub fn merge(
        &self,
        kept_base: &[EnvPair],
        extra: &[EnvPair],
        managed: &[EnvPair],
    ) -> Vec<EnvPair> {
        let mut env = EnvMap::default();
        for (k, v) in kept_base.iter().chain(&self.terminal) {
            env.set(k, v);
        }
        for (k, v) in extra {
            if !self.is_managed(k) {
                env.set(k, v);
            }
        }
        for (k, v) in managed {
            env.set(k, v);
        }
        env.into_vec()
    }

    pub fn build(&self, base: &[EnvPair], extra: &[EnvPair], managed: &[EnvPair]) -> Vec<EnvPair> {
        self.merge(&self.kept_base(base), extra, managed)
    }
}

/// The harness's environment as the cache sees it: compared against the last snapshot
/// without copying, and copied only when it changed.
pub trait EnvSource {
    type Error: From<CoreError>;
    fn entry_count(&self) -> usize;
    /// Whether the entries equal `snapshot`, in order.
    fn equals(&self, snapshot: &[EnvPair]) -> Result<bool, Self::Error>;
    fn pairs(&self) -> Result<Vec<EnvPair>, Self::Error>;
}

impl EnvSource for [EnvPair] {
    type Error = CoreError;

    fn entry_count(&self) -> usize {
        <[EnvPair]>::len(self)
    }

    fn equals(&self, snapshot: &[EnvPair]) -> Result<bool, CoreError> {
        Ok(self == snapshot)
    }

    fn pairs(&self) -> Result<Vec<EnvPair>, CoreError> {
        Ok(self.to_vec())
    }
}

/// `NAME=value` C strings ready for execve; refuses empty names, `=` in a name and NUL.
pub fn envp_from_pairs(pairs: Vec<EnvPair>) -> Result<Vec<CString>, CoreError> {
    pairs
        .into_iter()
        .map(|(mut k, v)| {
            if k.is_empty() || k.contains(&b'=') {
                return Err(CoreError::Invalid(
                    "invalid environment variable name".into(),
                ));
            }
            k.push(b'=');
            k.extend_from_slice(&v);
            CString::new(k)
                .map_err(|_| CoreError::Invalid("the environment contains a NUL byte".into()))
        })
        .collect()
}

/// The last inherited environment seen, its filtered layer, and the complete environment
/// of a call without caller layers (the common case), all valid while `snapshot` is.
#[derive(Default)]
struct EnvCache {
    snapshot: Vec<EnvPair>,
    kept: Vec<EnvPair>,
    plain: Option<Arc<Vec<CString>>>,
}

/// An executor's environment rules with the filtered inherited layer cached until the
/// harness's environment changes.
pub struct EnvBuilder {
    policy: EnvPolicy,
    cache: Mutex<EnvCache>,
}

impl EnvBuilder {
    pub fn new(policy: EnvPolicy) -> Self {
        Self {
            policy,
            cache: Mutex::new(EnvCache::default()),
        }
    }

    /// The child environment for one call: `base` filtered by the rules, then terminal,
    /// `extra` and `managed`.
    pub fn build<S: EnvSource + ?Sized>(
        &self,
        base: &S,
        extra: &[EnvPair],
        managed: &[EnvPair],
    ) -> Result<Arc<Vec<CString>>, S::Error> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let same = base.entry_count() == cache.snapshot.len() && base.equals(&cache.snapshot)?;
        if !same {
            let snapshot = base.pairs()?;
            let kept = self.policy.kept_base(&snapshot);
            *cache = EnvCache {
                snapshot,
                kept,
                plain: None,
            };
        }
        let plain = extra.is_empty() && managed.is_empty();
        if plain {
            if let Some(envp) = &cache.plain {
                return Ok(Arc::clone(envp));
            }
        }
        let envp = Arc::new(envp_from_pairs(self.policy.merge(
            &cache.kept,
            extra,
            managed,
        ))?);
        if plain {
            cache.plain = Some(Arc::clone(&envp));
        }
        Ok(envp)
    }
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
        let policy = EnvPolicy::new(
            &["*KEY*".to_string(), "BASH_E?V".to_string()],
            "DSH_",
            vec![b"ENV".to_vec()],
            pairs(&[("TERM", "dumb")]),
        );
        let extra = pairs(&[("API_KEY", "mine"), ("DSH_SESSION_ID", "forged")]);
        let managed = pairs(&[("DSH_HOME", "/h")]);
        let mut base = base;
        base.push((b"BASH_ENV".to_vec(), b"rc".to_vec()));
        base.push((b"ENV".to_vec(), b"rc".to_vec()));
        let env = policy.build(&base, &extra, &managed);
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

    #[test]
    fn builder_caches_until_the_base_changes() {
        let policy = EnvPolicy::new(&["*KEY*".to_string()], "DSH_", vec![], vec![]);
        let builder = EnvBuilder::new(policy);
        let base = pairs(&[("PATH", "/bin"), ("API_KEY", "s")]);
        let first = builder.build(base.as_slice(), &[], &[]).unwrap();
        let again = builder.build(base.as_slice(), &[], &[]).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(first.as_slice(), [CString::new("PATH=/bin").unwrap()]);
        let layered = builder
            .build(base.as_slice(), &pairs(&[("A", "1")]), &[])
            .unwrap();
        assert!(!Arc::ptr_eq(&first, &layered));
        assert_eq!(layered.len(), 2);
        let changed = pairs(&[("PATH", "/usr/bin"), ("API_KEY", "s")]);
        let fresh = builder.build(changed.as_slice(), &[], &[]).unwrap();
        assert_eq!(fresh.as_slice(), [CString::new("PATH=/usr/bin").unwrap()]);
    }

    #[test]
    fn builder_refuses_bad_names_and_nul() {
        let builder = EnvBuilder::new(EnvPolicy::new(&[], "", vec![], vec![]));
        for bad in [("", "v"), ("A=B", "v"), ("A", "v\0w")] {
            let err = builder.build(&[][..], &pairs(&[bad]), &[]).unwrap_err();
            assert!(matches!(err, CoreError::Invalid(_)), "{bad:?}");
        }
    }
}
