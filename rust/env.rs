//! The child's environment: the harness's, scrubbed of credentials and managed names, plus
//! the caller's layers in a fixed order (later layers win).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use crate::errors::CoreError;
use crate::scrub::{has_url_password, Pattern};

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

/// An executor's fixed environment rules; `build` applies them to one call's layers:
/// the harness's environment minus scrubbed, dropped and managed-prefix names, then the
/// terminal settings, then the caller's `extra` (managed-prefix names ignored), then the
/// managed facts last. Later layers win.
pub struct EnvPolicy {
    /// Exact names never scrubbed (by a pattern or by the value rule).
    allowed: Vec<Vec<u8>>,
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
            allowed: Vec::new(),
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
    /// Exact names that are never scrubbed (`allow_env`).
    pub fn with_allowed(mut self, names: Vec<Vec<u8>>) -> Self {
        self.allowed = names;
        self
    }

    /// Whether the inherited variable `name` (whatever its value) survives the name rules.
    pub fn keeps(&self, name: &[u8]) -> bool {
        if self.is_managed(name) || self.drop_names.iter().any(|d| d == name) {
            return false;
        }
        if self.allowed.iter().any(|a| a == name) {
            return true;
        }
        let upper = String::from_utf8_lossy(name).to_uppercase();
        !self.patterns.iter().any(|p| p.matches(&upper))
    }

    /// Whether the inherited entry survives: the name rules, then the value rule (a value
    /// carrying a URL with a password is a credential whatever its name).
    pub fn keeps_entry(&self, name: &[u8], value: &[u8]) -> bool {
        self.keeps(name) && (self.allowed.iter().any(|a| a == name) || !has_url_password(value))
    }

    pub fn kept_base(&self, base: &[EnvPair]) -> Vec<EnvPair> {
        base.iter()
            .filter(|(k, v)| self.keeps_entry(k, v))
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

    #[test]
    fn allowed_names_and_url_values() {
        let policy = EnvPolicy::new(&["*KEY*".to_string()], "DSH_", vec![], vec![])
            .with_allowed(vec![b"KEYBOARD_LAYOUT".to_vec(), b"MIRROR".to_vec()]);
        let base = vec![
            (b"DATABASE_URL".to_vec(), b"postgres://u:p@h/db".to_vec()),
            (b"MIRROR".to_vec(), b"https://u:p@m/".to_vec()),
            (b"KEYBOARD_LAYOUT".to_vec(), b"us".to_vec()),
            (b"API_KEY".to_vec(), b"x".to_vec()),
            (b"HOME".to_vec(), b"/root".to_vec()),
        ];
        let kept: Vec<Vec<u8>> = policy
            .kept_base(&base)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            kept,
            vec![
                b"MIRROR".to_vec(),
                b"KEYBOARD_LAYOUT".to_vec(),
                b"HOME".to_vec()
            ]
        );
    }
}
