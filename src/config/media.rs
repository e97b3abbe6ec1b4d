//! Media-type settings: the allow-list of `FILEDOCK_ALLOWED_TYPES`.

/// `type/subtype` of a media type, lower-cased, without parameters.
pub fn essence(media_type: &str) -> String {
    media_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The allow-list of `FILEDOCK_ALLOWED_TYPES`: exact types and `type/*`
/// wildcards; empty allows every type.
#[derive(Clone, Debug, Default)]
pub struct AllowedTypes(Vec<String>);

impl AllowedTypes {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// From a comma list, e.g. `image/*, application/pdf`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut list = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let e = essence(item);
            let Some((ty, sub)) = e.split_once('/') else {
                return Err(format!("{item:?} is not type/subtype or type/*"));
            };
            if ty.is_empty() || sub.is_empty() || ty == "*" {
                return Err(format!("{item:?} is not type/subtype or type/*"));
            }
            list.push(e);
        }
        Ok(Self(list))
    }

    pub fn allows(&self, media_type: &str) -> bool {
        let e = essence(media_type);
        self.0.is_empty()
            || self.0.iter().any(|a| match a.strip_suffix("/*") {
                Some(ty) => e.split_once('/').is_some_and(|(t, _)| t == ty),
                None => *a == e,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_matches_exact_types_and_wildcards() {
        let a = AllowedTypes::parse("image/*, Application/PDF").unwrap();
        assert!(a.allows("image/png") && a.allows("application/pdf; x=y"));
        assert!(!a.allows("text/plain") && !a.allows("imagex/png"));
        assert!(AllowedTypes::default().allows("anything/at-all"));
        for bad in ["image", "*/*", "/png"] {
            assert!(AllowedTypes::parse(bad).is_err(), "{bad}");
        }
    }
}
