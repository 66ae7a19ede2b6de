//! List queries: `limit`, `marker`, `offset`, `sort=key[:dir],...` (or the legacy
//! `sort_key`/`sort_dir`), and filters, validated as Cinder validates them
//! (`cinder/api/common.py`): a bad value is a 400, and from microversion 3.31 so is an unknown
//! filter.

use std::collections::BTreeMap;

use super::error::ApiError;
use super::microversion::{RESOURCE_FILTER, Version};
use crate::domain::list::{MAX_PAGE, Page};

/// A parsed list query.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub page: Page,
    /// Filters that the resource accepts, by their (possibly renamed) key.
    pub filters: BTreeMap<String, String>,
    /// `all_tenants` was given (honoured for admins only).
    pub all_tenants: bool,
    /// Other keys the caller may pass without effect (`with_count` and the like).
    pub flags: BTreeMap<String, String>,
}

/// What one resource's list accepts.
pub struct ListSpec {
    pub sort_keys: &'static [&'static str],
    /// (query key, sort key) pairs: Cinder's other names of a sort key (its `display_name` for
    /// `name`, `size` for Berth's `size_gib`), which its clients send.
    pub sort_aliases: &'static [(&'static str, &'static str)],
    /// (query key, filter key) pairs; e.g. attachments rename `instance_id` to `instance_uuid`.
    pub filters: &'static [(&'static str, &'static str)],
    /// Keys accepted and handed back in `flags`.
    pub flags: &'static [&'static str],
}

/// The value of one parameter of a query that is not a list's (`force`, `all_tenants`), if the
/// query has it.
pub fn param(raw: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
}

pub fn parse(raw: Option<&str>, spec: &ListSpec, version: Version) -> Result<ListQuery, ApiError> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if let Some((key, _)) = pairs.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')) {
        return Err(super::body::nul_refused(&format!("query parameter {key:?}")));
    }
    let mut q = ListQuery::default();
    let mut sort: Option<String> = None;
    let (mut sort_key, mut sort_dir): (Option<String>, Option<String>) = (None, None);
    let mut unknown = Vec::new();
    for (key, value) in pairs {
        match key.as_str() {
            "limit" => q.page.limit = Some(non_negative("limit", &value)?.min(MAX_PAGE)),
            "offset" => q.page.offset = Some(non_negative("offset", &value)?),
            "marker" => q.page.marker = Some(value),
            "sort" => sort = Some(value),
            "sort_key" => sort_key = Some(value),
            "sort_dir" => sort_dir = Some(value),
            "all_tenants" => q.all_tenants = true,
            k if spec.flags.contains(&k) => {
                q.flags.insert(key.clone(), value);
            }
            k => match spec.filters.iter().find(|(query, _)| *query == k) {
                Some((_, filter)) => {
                    q.filters.insert(filter.to_string(), value);
                }
                None => unknown.push(key.clone()),
            },
        }
    }
    if !unknown.is_empty() && version >= RESOURCE_FILTER {
        return Err(ApiError::bad_request(format!(
            "Invalid filters {} are found in query options.",
            unknown.join(",")
        )));
    }
    if sort.is_some() && (sort_key.is_some() || sort_dir.is_some()) {
        return Err(ApiError::bad_request(
            "Invalid input received: The 'sort_key' and 'sort_dir' parameters are deprecated and cannot be used with \
             the 'sort' parameter.",
        ));
    }
    let items: Vec<(String, Option<String>)> = match (sort, sort_key) {
        (Some(sort), _) => sort
            .split(',')
            .map(|item| match item.split_once(':') {
                Some((k, d)) => (k.trim().to_string(), Some(d.trim().to_string())),
                None => (item.trim().to_string(), None),
            })
            .collect(),
        (None, Some(key)) => vec![(key, sort_dir)],
        (None, None) => Vec::new(),
    };
    for (key, dir) in items {
        let key = match spec.sort_aliases.iter().find(|(alias, _)| *alias == key) {
            Some((_, canonical)) => canonical.to_string(),
            None => key,
        };
        if !spec.sort_keys.contains(&key.as_str()) {
            return Err(ApiError::bad_request(format!("Invalid input received: Invalid sort key {key:?}")));
        }
        let ascending = match dir.as_deref() {
            None | Some("desc") => false,
            Some("asc") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid input received: Invalid sort direction {other:?}"
                )));
            }
        };
        q.page.sort.push((key, ascending));
    }
    Ok(q)
}

fn non_negative(name: &str, value: &str) -> Result<i64, ApiError> {
    value.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Invalid input received: {name} must be a non-negative integer, not {value:?}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: ListSpec = ListSpec {
        sort_keys: &["created_at", "id"],
        sort_aliases: &[("date", "created_at")],
        filters: &[("volume_id", "volume_id"), ("instance_id", "instance_uuid")],
        flags: &["with_count"],
    };

    #[test]
    fn paging_sorting_and_filters_are_parsed() {
        let q = parse(
            Some("limit=5&offset=2&marker=m&sort=id:asc,created_at&instance_id=i"),
            &SPEC,
            Version::new(3, 44),
        )
        .unwrap();
        assert_eq!((q.page.limit, q.page.offset, q.page.marker.as_deref()), (Some(5), Some(2), Some("m")));
        assert_eq!(q.page.sort, vec![("id".to_string(), true), ("created_at".to_string(), false)]);
        assert_eq!(q.filters.get("instance_uuid").map(String::as_str), Some("i"));
        let aliased = parse(Some("sort=date:asc"), &SPEC, Version::new(3, 44)).unwrap();
        assert_eq!(aliased.page.sort, vec![("created_at".to_string(), true)], "an alias sorts by its key");
        let legacy = parse(Some("sort_key=date&sort_dir=asc"), &SPEC, Version::new(3, 44)).unwrap();
        assert_eq!(legacy.page.sort, vec![("created_at".to_string(), true)]);
    }

    #[test]
    fn bad_values_are_400s() {
        let v = Version::new(3, 44);
        for bad in [
            "limit=-1",
            "limit=x",
            "offset=-5",
            "sort=bogus",
            "sort=id:sideways",
            "sort=id&sort_key=id",
            "color=red",
        ] {
            assert_eq!(parse(Some(bad), &SPEC, v).unwrap_err().status.as_u16(), 400, "{bad}");
        }
        assert!(
            parse(Some("color=red"), &SPEC, Version::new(3, 27)).is_ok(),
            "unknown filters are ignored before 3.31"
        );
    }
}
