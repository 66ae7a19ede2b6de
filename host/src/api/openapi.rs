//! The API's OpenAPI 3.1 document (`GET /openapi.json`), generated from the code. Every route is
//! an [`Endpoint`] that carries its handler and its description together: the router and the
//! document are built from the one list ([`super::endpoints`]), so neither has a route the other
//! lacks. Request and response bodies are described by the JSON Schema of the Rust types the
//! handlers parse and answer with (schemars; JSON Schema 2020-12 is OpenAPI 3.1's dialect), list
//! parameters by the resource's [`ListSpec`], and every error by Cinder's fault shape.
//!
//! Paths are written without the project (`/v3/volumes`): Berth serves `/v3/{project_id}/...`
//! and `/v3/...` alike, the project coming from the token. Microversions: an operation's lowest
//! one is its `x-openstack-microversion` (below it the answer is 404), and a field that appears
//! from a microversion on says so in its description.

use std::collections::BTreeMap;

use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::routing::{MethodFilter, MethodRouter};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value, json};

use super::AppState;
use super::error::fault_name;
use super::microversion::{MAX, MIN, Version};
use super::query::ListSpec;
use crate::runtime::contract::Protocol;

/// Describes a type in the document (and adds its definitions to the generator).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// One operation: a route and its description.
pub struct Endpoint {
    pub method: Method,
    /// Under `/v3` for resources (`/attachments/{id}`), or from the root.
    pub path: &'static str,
    pub route: MethodRouter<AppState>,
    pub doc: Doc,
}

/// What the document says of an operation.
#[derive(Clone)]
pub struct Doc {
    pub id: &'static str,
    pub summary: &'static str,
    pub tag: &'static str,
    /// The lowest microversion that has it; `None` for the unversioned routes outside `/v3`.
    pub since: Option<Version>,
    pub request: Option<SchemaFn>,
    /// Success statuses with their bodies (`None`: no body).
    pub answers: Vec<(StatusCode, &'static str, Option<SchemaFn>)>,
    /// The list parameters it takes.
    pub list: Option<&'static ListSpec>,
    /// Other query parameters: (name, description).
    pub query: Vec<(&'static str, &'static str)>,
    /// Operations that take a value of its answer: (link name, operation id, parameter, JSON
    /// pointer into the answer's body). A parameter that starts with `/` is a place in the
    /// target's request body.
    pub links: Vec<(&'static str, &'static str, &'static str, &'static str)>,
    /// A media type other than JSON for its success answer (`GET /healthcheck`).
    pub media_type: &'static str,
}

impl Endpoint {
    fn on<H, T>(method: Method, path: &'static str, handler: H, id: &'static str) -> Endpoint
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("a method axum routes");
        Endpoint {
            method,
            path,
            route: axum::routing::on(filter, handler),
            doc: Doc {
                id,
                summary: "",
                tag: "",
                since: Some(MIN),
                request: None,
                answers: Vec::new(),
                list: None,
                query: Vec::new(),
                links: Vec::new(),
                media_type: "application/json",
            },
        }
    }

    pub fn get<H: Handler<T, AppState>, T: 'static>(
        path: &'static str,
        handler: H,
        id: &'static str,
    ) -> Self {
        Self::on(Method::GET, path, handler, id)
    }

    pub fn post<H: Handler<T, AppState>, T: 'static>(
        path: &'static str,
        handler: H,
        id: &'static str,
    ) -> Self {
        Self::on(Method::POST, path, handler, id)
    }

    pub fn put<H: Handler<T, AppState>, T: 'static>(
        path: &'static str,
        handler: H,
        id: &'static str,
    ) -> Self {
        Self::on(Method::PUT, path, handler, id)
    }

    pub fn delete<H: Handler<T, AppState>, T: 'static>(
        path: &'static str,
        handler: H,
        id: &'static str,
    ) -> Self {
        Self::on(Method::DELETE, path, handler, id)
    }

    pub fn summary(mut self, tag: &'static str, summary: &'static str) -> Self {
        self.doc.tag = tag;
        self.doc.summary = summary;
        self
    }

    /// The lowest microversion that has it.
    pub fn since(mut self, version: Version) -> Self {
        self.doc.since = Some(version);
        self
    }

    /// Outside `/v3`: no microversion, no authentication.
    pub fn unversioned(mut self) -> Self {
        self.doc.since = None;
        self
    }

    /// Its request body is a `T`.
    pub fn body<T: JsonSchema>(mut self) -> Self {
        self.doc.request = Some(|g| g.subschema_for::<T>());
        self
    }

    /// Its request body, described otherwise (several shapes).
    pub fn body_with(mut self, schema: SchemaFn) -> Self {
        self.doc.request = Some(schema);
        self
    }

    /// It answers `status` with a `T`.
    pub fn answers<T: JsonSchema>(mut self, status: StatusCode, description: &'static str) -> Self {
        self.doc.answers.push((status, description, Some(|g| g.subschema_for::<T>())));
        self
    }

    /// It answers `status` with a body described otherwise.
    pub fn answers_with(mut self, status: StatusCode, description: &'static str, schema: SchemaFn) -> Self {
        self.doc.answers.push((status, description, Some(schema)));
        self
    }

    /// It answers `status` with no body.
    pub fn answers_empty(mut self, status: StatusCode, description: &'static str) -> Self {
        self.doc.answers.push((status, description, None));
        self
    }

    /// It takes the list parameters of `spec`.
    pub fn list(mut self, spec: &'static ListSpec) -> Self {
        self.doc.list = Some(spec);
        self
    }

    pub fn query(mut self, name: &'static str, description: &'static str) -> Self {
        self.doc.query.push((name, description));
        self
    }

    /// Its answer's `pointer` gives `parameter` of operation `operation`.
    pub fn link(
        mut self,
        name: &'static str,
        operation: &'static str,
        parameter: &'static str,
        pointer: &'static str,
    ) -> Self {
        self.doc.links.push((name, operation, parameter, pointer));
        self
    }

    pub fn media_type(mut self, media_type: &'static str) -> Self {
        self.doc.media_type = media_type;
        self
    }

    /// The path as the document (and a client without a project in its URLs) writes it.
    pub fn full_path(&self) -> String {
        match self.doc.since {
            Some(_) => format!("/v3{}", self.path),
            None => self.path.to_string(),
        }
    }
}

/// Cinder's fault: `{"<faultName>": {"code": N, "message": "..."}}`.
fn fault(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = (400..=599)
        .filter_map(|c| StatusCode::from_u16(c).ok())
        .map(fault_name)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    json_schema!({
        "description": "Cinder's error shape: one member, named after the fault, holding the status and a message.",
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "propertyNames": {"enum": names},
        "additionalProperties": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer", "minimum": 400, "maximum": 599},
                "message": {"type": "string"}
            }
        }
    })
}

/// The microversions worth asking for: the lowest, those where behaviour changes, the highest.
const VERSIONS: [Version; 6] = [
    MIN,
    super::microversion::NEW_ATTACH,
    super::microversion::NEW_ATTACH_COMPLETION,
    super::microversion::SHARED_TARGETS,
    MAX,
    MAX,
];

fn list_parameters(spec: &ListSpec) -> Vec<Value> {
    let query = |name: &str, description: String, schema: Value| json!({"name": name, "in": "query", "required": false, "description": description, "schema": schema});
    let sort_keys: Vec<&str> =
        spec.sort_keys.iter().copied().chain(spec.sort_aliases.iter().map(|(alias, _)| *alias)).collect();
    let mut out = vec![
        query(
            "limit",
            "The most items to answer (at most 1000).".into(),
            json!({"type": "integer", "minimum": 0}),
        ),
        query("marker", "The id of the last item of the previous page.".into(), json!({"type": "string"})),
        query("offset", "Items to skip.".into(), json!({"type": "integer", "minimum": 0})),
        query(
            "sort",
            format!("`key[:asc|desc],...`; keys: {}.", sort_keys.join(", ")),
            json!({"type": "string"}),
        ),
        query("sort_key", "Deprecated: one sort key.".into(), json!({"type": "string", "enum": sort_keys})),
        query(
            "sort_dir",
            "Deprecated: `asc` or `desc`.".into(),
            json!({"type": "string", "enum": ["asc", "desc"]}),
        ),
        query("all_tenants", "Every project's (admins only).".into(), json!({"type": "string"})),
    ];
    for (key, _) in spec.filters {
        out.push(query(key, format!("Only items whose `{key}` is this."), json!({"type": "string"})));
    }
    for flag in spec.flags {
        let description = match *flag {
            "created_at" | "updated_at" => format!(
                "From microversion 3.60: `<op>:<ISO 8601 time>`, `op` one of `gt`, `gte`, `eq`, `neq`, `lt`, \
                 `lte`; only volumes whose `{flag}` compares so."
            ),
            "consumes_quota" => "From microversion 3.65: `true` or `false`.".into(),
            "metadata" => {
                "Only volumes with every item of this dictionary, written as Python or JSON writes it \
                           (`{'key': 'value'}`)."
                    .into()
            }
            "size" => "Only volumes of this size (GiB).".into(),
            "bootable" => {
                "`true` or `false`: only volumes that may be booted from, or only the others.".into()
            }
            "availability_zone" => "Only volumes in this zone (every volume is in `nova`).".into(),
            "migration_status" => "Only volumes in this migration status (no volume here migrates).".into(),
            "group_id" => {
                "From microversion 3.10: only volumes of this group (no volume here is in one).".into()
            }
            "glance_metadata" => {
                "From microversion 3.4: only volumes made from such an image (none here).".into()
            }
            "project_id" => "Admins: only this project's volumes (with `all_tenants`).".into(),
            _ => format!("`{flag}`."),
        };
        out.push(query(flag, description, json!({"type": "string"})));
    }
    out
}

fn operation(endpoint: &Endpoint, generator: &mut SchemaGenerator) -> Value {
    let doc = &endpoint.doc;
    let mut parameters: Vec<Value> = Vec::new();
    for segment in endpoint.path.split('/').filter(|s| s.starts_with('{')) {
        let name = segment.trim_matches(|c| c == '{' || c == '}');
        parameters.push(json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}));
    }
    if let Some(spec) = doc.list {
        parameters.extend(list_parameters(spec));
    }
    for (name, description) in &doc.query {
        parameters.push(
            json!({"name": name, "in": "query", "required": false, "description": description, "schema": {"type": "string"}}),
        );
    }
    if let Some(since) = doc.since {
        // Those that have the operation (below, it is a 404), and `latest`.
        let mut versions: Vec<String> =
            VERSIONS.iter().filter(|v| **v >= since).map(|v| format!("volume {v}")).collect();
        versions.dedup();
        versions.push("volume latest".into());
        parameters.push(json!({
            "name": "OpenStack-API-Version",
            "in": "header",
            "required": since > MIN,
            "description": format!(
                "The microversion, `volume X.Y` from {since} to {MAX}, or `volume latest` ({MAX}); none means {MIN}."
            ),
            "schema": {"type": "string", "enum": versions},
        }));
    }
    let mut responses = Map::new();
    for (status, description, schema) in &doc.answers {
        let mut answer = json!({ "description": description });
        if let Some(schema) = schema {
            answer["content"] = json!({ doc.media_type: { "schema": schema(generator) } });
        }
        if !doc.links.is_empty() && status.is_success() {
            let links: Map<String, Value> = doc
                .links
                .iter()
                .map(|(name, op, parameter, pointer)| {
                    let value = Value::String(format!("$response.body#{pointer}"));
                    let link = match parameter.strip_prefix('/') {
                        Some(place) => json!({"operationId": op, "requestBody": nest(place, value)}),
                        None => json!({"operationId": op, "parameters": { *parameter: value }}),
                    };
                    (name.to_string(), link)
                })
                .collect();
            answer["links"] = Value::Object(links);
        }
        responses.insert(status.as_u16().to_string(), answer);
    }
    let fault = json!({"application/json": {"schema": {"$ref": "#/components/schemas/Fault"}}});
    responses.insert(
        "4XX".into(),
        json!({"description": "The request was refused (Cinder's fault shape).", "content": fault}),
    );
    responses.insert(
        "503".into(),
        json!({
            "description": "Unavailable for now (busy, or the node that serves the volume is down); retry after `Retry-After` seconds.",
            "content": fault,
            "headers": {"Retry-After": {"schema": {"type": "integer"}}}
        }),
    );
    if doc.since.is_some() {
        responses.insert(
            "5XX".into(),
            json!({"description": "A driver failed (502), or took too long (504): see README, \"Errors\".", "content": fault}),
        );
    }
    let mut op = json!({
        "operationId": doc.id,
        "summary": doc.summary,
        "tags": [doc.tag],
        "parameters": parameters,
        "responses": responses,
    });
    if let Some(since) = doc.since {
        op["x-openstack-microversion"] = json!(since.to_string());
    } else {
        op["security"] = json!([]);
    }
    if let Some(request) = doc.request {
        op["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": request(generator)}}
        });
    }
    op
}

/// The connector keys that the drivers of every backend need: those of the protocols every one
/// of them speaks.
pub fn connector_requires<'a>(backends: impl Iterator<Item = &'a Vec<Protocol>>) -> Vec<&'static str> {
    let key = |p: &Protocol| match p {
        Protocol::Iscsi | Protocol::Iser => Some("initiator"),
        Protocol::Nvmeof => Some("nqn"),
        Protocol::FibreChannel => Some("wwpns"),
        Protocol::Rbd | Protocol::Nfs | Protocol::Other(_) => None,
    };
    let mut common: Option<std::collections::BTreeSet<&'static str>> = None;
    for protocols in backends {
        // A backend that speaks several protocols needs the key of one of them: none for sure.
        let needs: std::collections::BTreeSet<&'static str> = match protocols.as_slice() {
            [one] => key(one).into_iter().collect(),
            _ => Default::default(),
        };
        common = Some(match common {
            None => needs,
            Some(c) => c.intersection(&needs).copied().collect(),
        });
    }
    common.unwrap_or_default().into_iter().collect()
}

/// `value` at `a/b/c` of an object: `{"a": {"b": {"c": value}}}`.
fn nest(place: &str, value: Value) -> Value {
    place.rsplit('/').fold(value, |inner, key| json!({ key: inner }))
}

/// What the document says of this deployment.
#[derive(Debug, Clone, Default)]
pub struct Deployment {
    /// The configured volume types' names and ids: what a volume create may name.
    pub volume_types: Vec<String>,
    /// The connector keys every configured backend's driver needs (iSCSI and iSER: `initiator`;
    /// NVMe-oF: `nqn`; Fibre Channel: `wwpns`).
    pub connector_requires: Vec<&'static str>,
}

/// The document.
pub fn document(endpoints: &[Endpoint], deployment: &Deployment) -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
    });
    let mut generator = settings.into_generator();
    let mut paths: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for e in endpoints {
        let op = operation(e, &mut generator);
        paths.entry(e.full_path()).or_default().insert(e.method.as_str().to_ascii_lowercase(), op);
    }
    let mut schemas: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    schemas.insert("Fault".into(), fault(&mut generator).to_value());
    if let Some(volume_type) =
        schemas.get_mut("CreateVolume").and_then(|s| s.pointer_mut("/properties/volume_type"))
        && !deployment.volume_types.is_empty()
    {
        let mut names: Vec<Value> = deployment.volume_types.iter().map(|t| json!(t)).collect();
        names.push(Value::Null);
        volume_type["enum"] = Value::Array(names);
    }
    if let Some(connector) = schemas.get_mut("ConnectorDoc")
        && !deployment.connector_requires.is_empty()
    {
        connector["required"] = json!(deployment.connector_requires);
    }
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "Berth Block Storage API",
            "version": env!("CARGO_PKG_VERSION"),
            "summary": "OpenStack Cinder's Block Storage v3 attachment API, as Berth serves it.",
            "description": format!(
                "Microversions {MIN} to {MAX} (`OpenStack-API-Version: volume X.Y`). Every path under `/v3` is also \
                 served as `/v3/{{project_id}}/...`. Errors have Cinder's fault shape."
            ),
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "security": [{"token": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Auth-Token",
                    "description": "A Keystone token, a static token, or `user:project` in noauth mode.",
                }
            }
        },
    })
}
