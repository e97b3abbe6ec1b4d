//! How a setting's variable is read: as set, else at its default, parsed.

use std::{str::FromStr, time::Duration};

use anyhow::Context;

/// The settings' variables (without `FILEDOCK_`), each as set or else at
/// its default.
pub(super) struct Vars<F>(pub(super) F);

impl<F: Fn(&str) -> Option<String>> Vars<F> {
    pub(super) fn get(&self, name: &str) -> Option<String> {
        (self.0)(name)
    }

    /// A setting that has a default (`SETTINGS` lists one), parsed.
    pub(super) fn value<T>(&self, name: &str) -> anyhow::Result<T>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        self.optional(name)?
            .with_context(|| format!("FILEDOCK_{name} has no default and is not set"))
    }

    /// A setting that may be unset, parsed if set.
    pub(super) fn optional<T>(&self, name: &str) -> anyhow::Result<Option<T>>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        self.get(name)
            .map(|raw| {
                raw.parse()
                    .map_err(|e| anyhow::anyhow!("FILEDOCK_{name}={raw:?}: {e}"))
            })
            .transpose()
    }

    /// A duration in (possibly fractional) seconds.
    pub(super) fn secs(&self, name: &str) -> anyhow::Result<Duration> {
        let secs: f64 = self.value(name)?;
        Duration::try_from_secs_f64(secs).map_err(|e| anyhow::anyhow!("FILEDOCK_{name}: {e}"))
    }
}
