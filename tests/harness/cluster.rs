//! Several `berth serve` on one PostgreSQL database, as real processes: each a node with its own
//! name and its own tgtd. Every node serves two backends: `tgt` (tgt-iscsi on the node's tgtd:
//! node-local, so a volume of it belongs to the node that made it) and `array` (the fake driver,
//! which reaches nothing and so stands for a network array: `shared`, any node runs its calls).
//! Volume types: `__DEFAULT__` and `multiattach` on `tgt`, `shared` and `shared-multiattach` on
//! `array`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth::store::Store;

use crate::invariants::{self, World};
use crate::process::BerthProcess;
use crate::server::Client;
use crate::tgt::TgtdProcess;

/// One node.
pub struct Node {
    pub name: String,
    pub tgtd: TgtdProcess,
    pub berth: BerthProcess,
}

impl Node {
    /// The `service_uuid` of its node-local `tgt` backend: its volumes'.
    pub fn tgt_uuid(&self) -> String {
        berth::attach::catalog::service_uuid(&self.name, "tgt")
    }

    /// An admin of project `e2e` at microversion 3.54, talking to this node.
    pub fn client(&self) -> Client {
        Client::for_base(&self.berth.base, "e2e").at("3.54")
    }
}

pub struct Cluster {
    /// The database every node uses.
    pub url: String,
    pub nodes: Vec<Node>,
}

/// The configuration of a node (after the lines the process harness writes).
pub fn node_config(tgtd: &TgtdProcess, lease_seconds: u64) -> String {
    format!(
        r#"{tgt}
[operations]
lease_seconds = {lease_seconds}
shutdown_wait_seconds = 1

[[backends]]
name = "tgt"
driver = "tgt-iscsi"
grants = ["iscsi-target", "backing-store"]

[[backends]]
name = "array"
driver = "fake"
shared = true

[[volume_types]]
name = "__DEFAULT__"
backend = "tgt"

[[volume_types]]
name = "multiattach"
backend = "tgt"
extra_specs = {{ multiattach = "<is> True" }}

[[volume_types]]
name = "shared"
backend = "array"

[[volume_types]]
name = "shared-multiattach"
backend = "array"
extra_specs = {{ multiattach = "<is> True" }}
"#,
        tgt = tgtd.config()
    )
}

impl Cluster {
    /// `n` nodes (`node-a`, `node-b`, ...) on a fresh PostgreSQL database; an operation's lease
    /// is `lease_seconds`.
    pub async fn start(n: usize, lease_seconds: u64) -> Cluster {
        Self::start_on(crate::pg::fresh_database().await, n, lease_seconds)
    }

    /// The same on a given (fresh) PostgreSQL database.
    pub fn start_on(url: String, n: usize, lease_seconds: u64) -> Cluster {
        let nodes = (0..n)
            .map(|i| {
                let name = format!("node-{}", (b'a' + i as u8) as char);
                let tgtd = TgtdProcess::start();
                let top = format!("node = \"{name}\"\ndatabase_url = \"{url}\"");
                let berth = BerthProcess::start_full(&top, &node_config(&tgtd, lease_seconds));
                Node { name, tgtd, berth }
            })
            .collect();
        Cluster { url, nodes }
    }

    /// Starts one more node named `name` on the cluster's database, its configuration being
    /// [`node_config`] changed by `edit`; the log of a node that refused to start.
    pub fn try_add(
        &self,
        name: &str,
        lease_seconds: u64,
        edit: impl Fn(String) -> String,
    ) -> Result<Node, String> {
        let tgtd = TgtdProcess::start();
        let top = format!("node = \"{name}\"\ndatabase_url = \"{}\"", self.url);
        let berth = BerthProcess::try_start(&top, &edit(node_config(&tgtd, lease_seconds)), &[])?;
        Ok(Node { name: name.to_string(), tgtd, berth })
    }

    /// A client of every node.
    pub fn clients(&self) -> Vec<Client> {
        self.nodes.iter().map(Node::client).collect()
    }

    /// The database, read directly.
    pub async fn store(&self) -> Store {
        invariants::open(&self.url).await
    }

    /// Every node's world: the database, and that node's tgtd.
    pub async fn worlds(&self, store: &Store) -> Vec<World> {
        let mut out = Vec::new();
        for n in &self.nodes {
            out.push(invariants::snapshot(store, &n.tgtd).await);
        }
        out
    }

    /// What is wrong: the invariants of `invariants.rs` for the whole database, and for each node
    /// its tgtd against the volumes it owns (and none of the others).
    pub async fn violations(&self, store: &Store) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (node, world) in self.nodes.iter().zip(self.worlds(store).await) {
            let mine = node.tgt_uuid();
            for v in invariants::violations_with(&world, |v| v.service_uuid.as_deref() == Some(mine.as_str()))
            {
                out.insert(format!("{}: {v}", node.name));
            }
        }
        out.into_iter().collect()
    }

    /// Waits until every invariant holds (reconcilers and take-overs may still be at work), up to
    /// `timeout` (and a minute for a comparison under way).
    pub async fn settled(&self, store: &Store, timeout: Duration) -> Result<(), Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            // One comparison that never ends (a read of the database or of a tgtd) fails the test
            // naming it, instead of hanging it.
            let compared = tokio::time::timeout(timeout + Duration::from_secs(60), self.violations(store));
            let wrong = compared.await.expect("a comparison of the database and the tgtds did not end");
            if wrong.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(wrong);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
