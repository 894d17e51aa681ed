//! `POST /wal` under a fence, in process: a node that does not lead answers 503 with
//! `Retry-After: 1`; an append made durable after the leadership ended answers 504 with
//! `"outcome": "indeterminate"`.

use std::time::{Duration, Instant};

use actix_web::{test as web_test, App};
use supervisor_actor::{Fence, NodeBuilder, ShutdownNode};

async fn post_wal(node: &supervisor_actor::Node) -> (u16, Option<String>, serde_json::Value) {
    let app =
        web_test::init_service(App::new().configure(walserver::http::configure(node.clone())))
            .await;
    let req = web_test::TestRequest::post()
        .uri("/wal")
        .set_payload("record")
        .to_request();
    let resp = tokio::time::timeout(Duration::from_secs(30), web_test::call_service(&app, req))
        .await
        .expect("answered by the deadline");
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: serde_json::Value = web_test::read_body_json(resp).await;
    (status, retry, body)
}

#[test]
fn a_node_that_does_not_lead_answers_503_and_a_lost_lead_504_indeterminate() {
    let dir = tempfile::tempdir().unwrap();
    actix_rt::System::new().block_on(async {
        let fence = Fence::closed();
        let node = NodeBuilder::primary(dir.path().join("data"))
            .listen("127.0.0.1:0".parse().unwrap())
            .segment_size(1 << 20)
            .io_threads(0)
            .synchronous_standby_names("never_connects")
            .unwrap()
            .fence(fence.clone())
            .start()
            .await
            .unwrap();
        let (status, retry, body) = post_wal(&node).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            body["error"].as_str().unwrap().contains("leadership"),
            "{body}"
        );
        assert!(body.get("outcome").is_none(), "{body}");

        // Led, but only briefly: the standby never confirms and the grant runs out.
        fence.grant(1, Instant::now() + Duration::from_millis(200));
        let (status, _, body) = post_wal(&node).await;
        assert_eq!(status, 504, "{body}");
        assert_eq!(body["outcome"], "indeterminate", "{body}");
        node.supervisor
            .send(ShutdownNode { immediate: true })
            .await
            .unwrap();
    });
}
