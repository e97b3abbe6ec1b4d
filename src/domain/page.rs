//! Pages of a list (files, sessions, agents): a limit and a cursor in, the
//! items and the next page's cursor out. Every list pages the same way.

use std::future::Future;

use super::{DomainError, FileId};

/// What one page may ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub limit: usize,
    /// The id after which the page starts (the cursor a previous page returned).
    pub after: Option<String>,
}

/// A page of a list, and the cursor of the next page (`None`: this is the last).
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl PageRequest {
    pub const DEFAULT_LIMIT: usize = 100;
    pub const MAX_LIMIT: usize = 1000;

    /// `limit` (1 to 1000, default 100) and a cursor this API returned.
    pub fn parse(limit: Option<usize>, cursor: Option<&str>) -> Result<Self, DomainError> {
        let limit = limit.unwrap_or(Self::DEFAULT_LIMIT);
        if !(1..=Self::MAX_LIMIT).contains(&limit) {
            return Err(DomainError::InvalidRequest(format!(
                "limit must be between 1 and {}",
                Self::MAX_LIMIT
            )));
        }
        // Every listed id is a UUID (files', sessions' and agents' alike), and
        // so is every cursor.
        let after = match cursor {
            Some(c) => Some(FileId::parse(c).ok_or_else(bad_cursor)?.to_string()),
            None => None,
        };
        Ok(Self { limit, after })
    }

    /// The page `fetch(after, n)` gives: it is asked for one item more than
    /// the limit, to learn whether another page follows without a second
    /// round trip. `id` names an item's place in the list (its cursor), an
    /// id of the kind `I` the list is ordered by.
    pub(crate) async fn fetch<T, I, F, Fut, E>(
        &self,
        fetch: F,
        id: impl Fn(&T) -> I,
    ) -> Result<Page<T>, DomainError>
    where
        I: std::str::FromStr + std::fmt::Display,
        F: FnOnce(Option<I>, usize) -> Fut,
        Fut: Future<Output = Result<Vec<T>, E>>,
        DomainError: From<E>,
    {
        let after = match self.after.as_deref().map(str::parse::<I>) {
            Some(Err(_)) => return Err(bad_cursor()),
            after => after.and_then(Result::ok),
        };
        let mut items = fetch(after, self.limit + 1).await?;
        let next_cursor = if items.len() > self.limit {
            items.truncate(self.limit);
            items.last().map(|i| id(i).to_string())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}

fn bad_cursor() -> DomainError {
    DomainError::InvalidRequest("cursor is not a cursor this API returned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_cursors_are_checked() {
        assert_eq!(PageRequest::parse(None, None).unwrap().limit, 100);
        for bad in [0, 1001] {
            assert!(PageRequest::parse(Some(bad), None).is_err(), "limit {bad}");
        }
        assert!(PageRequest::parse(None, Some("not-a-cursor")).is_err());
        let id = FileId::new().to_string();
        assert_eq!(
            PageRequest::parse(Some(5), Some(&id)).unwrap().after,
            Some(id)
        );
    }

    #[tokio::test]
    async fn a_page_has_a_cursor_only_when_more_follow() {
        let list: Vec<String> = (0..5).map(|i| i.to_string()).collect();
        let page_of = |limit| {
            let list = list.clone();
            async move {
                let req = PageRequest { limit, after: None };
                req.fetch(
                    |_, n| async move { Ok::<_, DomainError>(list.into_iter().take(n).collect()) },
                    |s: &String| s.clone(),
                )
                .await
                .unwrap()
            }
        };
        let p = page_of(2).await;
        assert_eq!((p.items.len(), p.next_cursor.as_deref()), (2, Some("1")));
        let p = page_of(5).await;
        assert_eq!((p.items.len(), p.next_cursor), (5, None));
    }
}
