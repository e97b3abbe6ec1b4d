//! openapi.yaml is the contract: it must list exactly the routes the router serves.

use std::collections::BTreeSet;

#[test]
fn the_spec_and_the_router_agree_on_paths_and_methods() {
    let spec: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap(),
    )
    .unwrap();
    let methods = ["get", "head", "options", "post", "put", "delete", "patch"];
    let in_spec: BTreeSet<(String, String)> = spec["paths"]
        .as_mapping()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            let path = path.as_str().unwrap().to_owned();
            item.as_mapping()
                .unwrap()
                .keys()
                .filter_map(|m| m.as_str())
                .filter(|m| methods.contains(m))
                .map(move |m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let in_router: BTreeSet<(String, String)> = filedock::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        in_spec.difference(&in_router).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "in openapi.yaml but not served"
    );
    assert_eq!(
        in_router.difference(&in_spec).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "served but not in openapi.yaml"
    );
}
