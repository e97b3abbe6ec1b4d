//! How every list is asked for and answered: `?limit=&cursor=` in,
//! `{"<items>": […], "next_cursor": …}` out (files, sessions, agents).

use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::{ApiError, ApiResult, ok};
use crate::domain::page::{Page, PageRequest};

/// `?limit=` (1 to 1000, default 100) and `?cursor=` (a previous page's `next_cursor`).
#[derive(Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

impl ListQuery {
    pub fn page(&self) -> Result<PageRequest, ApiError> {
        Ok(PageRequest::parse(self.limit, self.cursor.as_deref())?)
    }
}

/// `{"<name>": [items as `view` shows them], "next_cursor": … | null}`.
pub fn page_response<T, V: Serialize>(
    name: &str,
    page: Page<T>,
    view: impl Fn(T) -> V,
) -> ApiResult {
    let items: Vec<V> = page.items.into_iter().map(view).collect();
    let mut body = Map::new();
    body.insert(
        name.to_owned(),
        serde_json::to_value(items).map_err(ApiError::internal)?,
    );
    body.insert("next_cursor".into(), page.next_cursor.into());
    ok(Json(Value::Object(body)))
}
