//! `FILEDOCK_*` variables that are no setting. Left alone, a typo is
//! silent: `FILEDOCK_REDIS_MOD=cluster` runs single-node without a word.
//! At start-up each is named with the setting it most likely meant
//! (`Settings::check_variables` says when that refuses to start).

use std::fmt;

use super::table::SETTINGS;

/// Variables under `FILEDOCK_` that are someone else's, not typos: the
/// command-line client's and the scripts'.
const OTHERS: &[&str] = &[
    "FILEDOCK_URL",
    "FILEDOCK_API_KEY",
    "FILEDOCK_BIN",
    "FILEDOCK_CACHE",
];

/// The test, benchmark and fault harnesses' variables, by prefix (a server
/// they start inherits them).
const HARNESSES: &[&str] = &["FILEDOCK_TEST_", "FILEDOCK_BENCH_", "FILEDOCK_FAULT_"];

const PREFIX: &str = "FILEDOCK_";

/// A variable that is no setting, with the setting whose name is closest
/// to it, if one is close enough to be the one meant.
#[derive(Debug, PartialEq, Eq)]
pub struct Unknown {
    pub var: String,
    pub closest: Option<&'static str>,
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Escaped: a name is the environment's, and may hold a line break.
        let var = self.var.escape_debug();
        match self.closest {
            Some(setting) => write!(f, "{var} is not a setting; did you mean {setting}?"),
            None => write!(f, "{var} is not a setting (`filedock --help` lists them)"),
        }
    }
}

/// Of the variables `names` (the environment's names; never their
/// values), those that look like settings (`FILEDOCK_…`, in any case) and
/// are none, in name order.
pub fn unknown_variables(names: impl IntoIterator<Item = String>) -> Vec<Unknown> {
    let mut unknown: Vec<Unknown> = names
        .into_iter()
        .filter(|n| is_unknown(n))
        .map(|var| Unknown {
            closest: closest(&var),
            var,
        })
        .collect();
    unknown.sort_by(|a, b| a.var.cmp(&b.var));
    unknown
}

fn is_unknown(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with(PREFIX)
        && !SETTINGS.iter().any(|s| s.var == name)
        && !OTHERS.contains(&name)
        && !HARNESSES.iter().any(|p| name.starts_with(p))
}

/// The setting `var` most likely meant (compared upper-cased): the
/// shortest that begins with it (`FILEDOCK_LOCK_TTL` for
/// `FILEDOCK_LOCK_TTL_SECS`), else the nearest by edit distance if within
/// a third of the name past `FILEDOCK_` (at least two edits): near enough
/// to be a typo of it, not merely another name.
fn closest(var: &str) -> Option<&'static str> {
    let upper = var.to_ascii_uppercase();
    let begun = SETTINGS
        .iter()
        .map(|s| s.var)
        .filter(|s| s.starts_with(&format!("{upper}_")))
        .min_by_key(|s| s.len());
    if begun.is_some() {
        return begun;
    }
    let rest = upper.len().saturating_sub(PREFIX.len());
    let (distance, setting) = SETTINGS
        .iter()
        .map(|s| (strsim::damerau_levenshtein(&upper, s.var), s.var))
        .min()?;
    (distance <= (rest / 3).max(2)).then_some(setting)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(names: &[&str]) -> Vec<Unknown> {
        unknown_variables(names.iter().map(|n| n.to_string()))
    }

    #[test]
    fn a_typo_is_named_with_the_setting_it_meant() {
        let found = unknown(&[
            "FILEDOCK_REDIS_MOD",
            "FILEDOCK_S3_ENDPIONT",
            "filedock_bind",
            "FILEDOCK_LOCK_TTL",
        ]);
        let named: Vec<_> = found.iter().map(|u| (u.var.as_str(), u.closest)).collect();
        assert_eq!(
            named,
            [
                ("FILEDOCK_LOCK_TTL", Some("FILEDOCK_LOCK_TTL_SECS")),
                ("FILEDOCK_REDIS_MOD", Some("FILEDOCK_REDIS_MODE")),
                ("FILEDOCK_S3_ENDPIONT", Some("FILEDOCK_S3_ENDPOINT")),
                ("filedock_bind", Some("FILEDOCK_BIND")),
            ]
        );
        assert_eq!(
            found[1].to_string(),
            "FILEDOCK_REDIS_MOD is not a setting; did you mean FILEDOCK_REDIS_MODE?"
        );
    }

    #[test]
    fn a_name_near_no_setting_is_named_alone() {
        let found = unknown(&["FILEDOCK_COLOUR_SCHEME"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].closest, None);
        assert!(found[0].to_string().contains("filedock --help"));
    }

    #[test]
    fn settings_other_programs_variables_and_other_names_are_not_unknown() {
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.var).collect();
        names.extend(OTHERS);
        names.extend([
            "FILEDOCK_TEST_BACKEND",
            "FILEDOCK_BENCH_BASE_BIN",
            "FILEDOCK_FAULT_SEED",
            "PATH",
            "RUST_LOG",
            "MY_FILEDOCK_THING",
        ]);
        assert_eq!(unknown(&names), []);
    }
}
