//! Bounds that keep one client from hurting the others, and secrets that do not outlive their
//! use: attachments per volume, header-read and idle timeouts, requests in flight, and what a
//! detached attachment keeps in the database.

use std::time::Duration;

use berth_tests::server::{Db, TestServer, connector, fake_config};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn a_volume_takes_at_most_max_per_volume_attachments() {
    let mut config = fake_config();
    config.attachments.max_per_volume = 3;
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let host = format!("h{i}");
        let r = c.attach(&volume, Some(connector(&format!("iqn.1993-08.org.debian:01:{host}"), &host))).await;
        ids.push(r.expect(200).body["attachment"]["id"].as_str().unwrap().to_string());
    }
    let message = c.attach(&volume, None).await.fault(413, "overLimit");
    assert_eq!(message, format!("Maximum number of attachments (3) reached for volume {volume}"));
    let legacy = c.post(&format!("/volumes/{volume}/action"), json!({"os-reserve": null})).await;
    legacy.fault(413, "overLimit");
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"].as_array().unwrap().len(), 3, "nothing was added");
    c.delete(&format!("/attachments/{}", ids[0])).await.expect(200);
    c.attach(&volume, None).await.expect(200);
}

/// Reads until the server closes the connection (or 30 s pass, which fails the test).
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn connections_that_send_no_complete_request_are_closed() {
    let mut config = fake_config();
    config.http.header_read_timeout_seconds = 0.5;
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let addr = s.base.trim_start_matches("http://").to_string();

    // Connects and says nothing.
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    assert!(closed_by_server(&mut silent).await, "a silent connection must be closed");

    // Sends half a header, then stalls (slowloris).
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    assert!(closed_by_server(&mut slow).await, "a stalled header must be closed");

    // Makes one request and keeps the connection idle.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = vec![0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_by_server(&mut idle).await, "an idle kept-alive connection must be closed");

    // The service itself is fine.
    s.client("p1").get("/volumes").await.expect(200);
}

#[tokio::test]
async fn beyond_max_requests_in_flight_the_api_answers_503_with_retry_after() {
    let mut config = fake_config();
    config.http.max_requests_in_flight = 1;
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let c = s.client("p1");
    // A request that takes its time inside (a slow driver call) holds the only place.
    let held = {
        let c = c.clone();
        tokio::spawn(async move {
            c.post(
                "/volumes",
                json!({"volume": {"size": 1, "metadata": {"fake.create-volume": "delay:1500"}}}),
            )
            .await
        })
    };
    let mut refused = None;
    for _ in 0..200 {
        let r = c.get("/volumes").await;
        if r.status == 503 {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a second request in flight must be refused");
    assert_eq!(refused.header("retry-after"), Some("1"));
    refused.fault(503, "serviceUnavailable");
    // The held request finishes normally, and then there is room again.
    held.await.unwrap().expect(202);
    c.get("/volumes").await.expect(200);
}

/// Reads a response's status line from a raw connection (within 30 s).
async fn status_of(stream: &mut TcpStream) -> Option<u16> {
    let mut buf = vec![0u8; 12];
    match tokio::time::timeout(Duration::from_secs(30), stream.read_exact(&mut buf)).await {
        Ok(Ok(_)) => std::str::from_utf8(&buf[9..12]).ok()?.parse().ok(),
        _ => None,
    }
}

/// The hardening issue's item 12: bodies were read before authentication, holding a place of
/// `max_requests_in_flight`, and nothing bounded the body's time, so connections that sent
/// their headers and then a byte a second made every other request a 503. Now a request without
/// credentials is refused on its headers, a slow body holds no place while it comes and is cut
/// off after `body_read_timeout_seconds` (408), and authenticated requests are answered
/// throughout.
#[tokio::test]
async fn slow_or_unauthenticated_bodies_take_no_place_and_requests_are_still_answered() {
    let mut config = fake_config();
    config.http.max_requests_in_flight = 4;
    config.http.body_read_timeout_seconds = 2.0;
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let head = |token: Option<&str>| {
        let auth = token.map(|t| format!("X-Auth-Token: {t}\r\n")).unwrap_or_default();
        format!(
            "POST /v3/p1/volumes HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{"
        )
    };
    let mut anonymous = Vec::new();
    let mut slow = Vec::new();
    for _ in 0..16 {
        let mut a = TcpStream::connect(&addr).await.unwrap();
        a.write_all(head(None).as_bytes()).await.unwrap();
        anonymous.push(a);
        let mut b = TcpStream::connect(&addr).await.unwrap();
        b.write_all(head(Some("u:p1")).as_bytes()).await.unwrap();
        slow.push(b);
    }
    // The slow ones keep trickling while others are answered.
    let trickle = tokio::spawn(async move {
        for _ in 0..8 {
            for b in slow.iter_mut() {
                let _ = b.write_all(b" ").await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        slow
    });
    let c = s.client("p1");
    for _ in 0..20 {
        c.get("/volumes").await.expect(200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.create_volume(json!({"size": 1})).await;
    for mut a in anonymous {
        assert_eq!(
            status_of(&mut a).await,
            Some(401),
            "a request without credentials is refused on its headers"
        );
    }
    let mut slow = trickle.await.unwrap();
    for b in slow.iter_mut() {
        assert_eq!(status_of(b).await, Some(408), "a body slower than the bound is cut off");
    }
    let listed = c.get("/volumes").await.expect(200);
    assert_eq!(listed.body["volumes"].as_array().unwrap().len(), 1, "no slow request created anything");
}

#[tokio::test]
async fn detached_rows_keep_neither_connection_info_nor_connector() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let a = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:gone", "gone"))).await.expect(200);
    let id = a.body["attachment"]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{id}")).await.expect(200);

    // A legacy attachment that is terminated keeps its row (until os-detach), but not its secrets.
    let legacy = c.create_volume(json!({"size": 1})).await;
    let path = format!("/volumes/{legacy}/action");
    let act = |body| c.post(&path, body);
    act(json!({"os-reserve": null})).await.expect(202);
    act(json!({"os-initialize_connection": {"connector": connector("iqn.1993-08.org.debian:01:t", "t")}}))
        .await
        .expect(200);
    act(json!({"os-terminate_connection": {"connector": connector("iqn.1993-08.org.debian:01:t", "t")}}))
        .await
        .expect(202);

    let rows: Vec<(String, i64, Option<String>, i64)> = s
        .service
        .store()
        .read(async |tx| {
            let rows = tx
                .query(
                    "SELECT id, deleted, connection_info, \
                     (SELECT COUNT(*) FROM attachment_specs s WHERE s.attachment_id = a.id) \
                     FROM volume_attachment a",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|r| Ok((r.text(0)?, r.int(1)?, r.opt_text(2)?, r.int(3)?)))
                .collect::<Result<Vec<_>, berth::store::StoreError>>()
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (id, deleted, info, specs) in rows {
        assert_eq!(info, None, "attachment {id} (deleted={deleted}) keeps its connection info");
        assert_eq!(specs, 0, "attachment {id} (deleted={deleted}) keeps its connector");
    }
}
