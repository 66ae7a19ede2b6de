//! The events owed to Nova (`store/compute_events.rs`, `attach/compute.rs`), on SQLite and on
//! PostgreSQL: an event due is claimed by one sender at a time (one more attempt each), a node
//! that starts again frees its own claims, a postponed event is due again later, a sent one is
//! gone. (Sending them to a stand-in Nova, across a kill: `tests/keystone.rs`.)

use berth::store::compute_events::{self, ComputeEvent};
use berth_tests::both_databases;

both_databases! {
    async fn an_event_owed_to_nova_is_claimed_by_one_sender_at_a_time(s) {
        let store = s.service.store();
        let event = ComputeEvent {
            id: "e1".into(),
            volume_id: "v1".into(),
            servers: vec!["s1".into(), "s2".into()],
            request_id: Some("req-1".into()),
            global_id: None,
            attempts: 0,
            created_at: 1_000,
        };
        store.write(async |tx| compute_events::insert(tx, &event).await).await.unwrap();
        let due = async |now: i64| store.read(async |tx| compute_events::due(tx, now, 10).await).await.unwrap();
        assert_eq!(due(500).await, Vec::<String>::new(), "not due before it was owed");
        assert_eq!(due(2_000).await, ["e1"]);

        let claim = async |node: &str, now: i64| {
            store.write(async |tx| compute_events::claim(tx, "e1", node, now, now + 60_000).await).await.unwrap()
        };
        let claimed = claim("node-a", 2_000).await.expect("claimed by node-a");
        assert_eq!(claimed, ComputeEvent { attempts: 1, ..event.clone() });
        assert_eq!(claim("node-b", 3_000).await, None, "node-a holds it");
        assert!(due(3_000).await.is_empty());

        // node-b starting again frees nothing of node-a's; node-a starting again frees its claim.
        let release = async |node: &str| store.write(async |tx| compute_events::release(tx, node, 4_000).await).await.unwrap();
        assert_eq!(release("node-b").await, 0);
        assert_eq!(release("node-a").await, 1);
        assert_eq!(due(4_000).await, ["e1"]);
        assert_eq!(claim("node-b", 4_000).await.map(|e| e.attempts), Some(2));

        store.write(async |tx| compute_events::postpone(tx, "e1", 10_000).await).await.unwrap();
        assert!(due(9_999).await.is_empty());
        assert_eq!(due(10_000).await, ["e1"]);
        store.write(async |tx| compute_events::delete(tx, "e1").await).await.unwrap();
        assert!(store.read(async |tx| compute_events::all(tx).await).await.unwrap().is_empty());
    }
}
