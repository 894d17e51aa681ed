//! etcd-gateway against a real etcd with client TLS (client certificates required) and
//! authentication on, with certificates the testkit makes: the calls work with the right CA,
//! certificate and password; a wrong password, an unknown CA, a certificate for another name
//! and a missing client certificate each fail with an error that says which; a user without
//! the role cannot write the leader key; an expired token is renewed without the caller
//! noticing.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use etcd_gateway::testkit::{EtcdServer, Pki};
use etcd_gateway::{Client, Compare, Error, EventKind, KeyRange, Op, Security, Txn, WatchRequest};
use tokio::time::timeout;

/// The keys the cluster `t` owns, as walserver names them.
const PREFIX: &[u8] = b"/walserver/t/";
const LEADER: &[u8] = b"/walserver/t/leader";
const USER: (&str, &str) = ("walserver", "walserver-password");

/// How long a test waits for an event etcd owes it. A guess for two busy cores.
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// A secured etcd with the user [`USER`] limited to [`PREFIX`].
fn secured(pki: &Pki, auth_token_ttl: Option<Duration>) -> EtcdServer {
    let etcd = EtcdServer::start_secured(pki, auth_token_ttl);
    etcd.add_user(USER.0, USER.1, Some(PREFIX));
    etcd
}

fn client(etcd: &EtcdServer, security: &Security) -> Client {
    Client::with_security([etcd.client_url()], security).expect("the client's settings load")
}

/// The TLS failure's reason, or a failure of the test naming what came instead.
fn tls_reason(result: etcd_gateway::Result<impl std::fmt::Debug>) -> Result<String> {
    match result {
        Err(e @ Error::Tls { .. }) => {
            assert!(e.is_refused_credentials());
            Ok(e.to_string())
        }
        other => bail!("expected a TLS error, got {other:?}"),
    }
}

#[actix_rt::test]
async fn the_right_ca_certificate_and_password_work_for_every_call() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    let client = client(&etcd, &etcd.security(Some(USER)));
    client.check_access().await.context("access is granted")?;

    let lease = client.lease_grant(5).await?;
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::prefix(PREFIX.to_vec())))
        .await
        .context("a watch on the prefix")?;
    let created = Txn::new()
        .when([Compare::absent(LEADER)])
        .and_then([Op::put(LEADER, b"n1", Some(lease.id))]);
    assert!(client.txn(&created).await?.succeeded, "the key was absent");
    let read = client.range(&KeyRange::key(LEADER)).await?;
    assert_eq!(read.kvs.len(), 1);
    assert_eq!(read.kvs[0].value, b"n1");
    assert_eq!(read.kvs[0].lease, lease.id);
    client
        .put(b"/walserver/t/members/n1", b"{}", Some(lease.id))
        .await?;
    let renewed = client.lease_keepalive(lease.id).await?;
    assert!(renewed.ttl > 0);
    assert!(client.lease_time_to_live(lease.id, false).await?.ttl > 0);

    let batch = timeout(EVENT_DEADLINE, watch.next_batch())
        .await
        .context("a watch event before the deadline")?
        .context("the watch went on")??;
    assert_eq!(batch.events[0].kind, EventKind::Put);
    assert_eq!(batch.events[0].kv.key, LEADER);

    client.lease_revoke(lease.id).await?;
    assert!(client.range(&KeyRange::key(LEADER)).await?.kvs.is_empty());
    // The role stops at the prefix.
    let outside = client.put(b"/walserver/other/leader", b"x", None).await;
    assert!(
        matches!(&outside, Err(Error::Status { message, .. }) if message.contains("permission denied")),
        "{outside:?}"
    );
    Ok(())
}

#[actix_rt::test]
async fn a_wrong_password_is_refused_as_such() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    let client = client(&etcd, &etcd.security(Some((USER.0, "not-the-password"))));
    match client.check_access().await {
        Err(e @ Error::AuthFailed { .. }) => {
            assert!(e.is_refused_credentials());
            let text = e.to_string();
            assert!(
                text.contains("walserver") && text.contains("password"),
                "{text}"
            );
        }
        other => bail!("expected a refused password, got {other:?}"),
    }
    Ok(())
}

#[actix_rt::test]
async fn an_unknown_ca_is_refused_as_such() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    let other = Pki::new();
    let mut security = etcd.security(Some(USER));
    security.cacert = Some(other.ca.clone());
    let text = tls_reason(client(&etcd, &security).check_access().await)?;
    assert!(text.contains("not signed by the CA"), "{text}");
    Ok(())
}

#[actix_rt::test]
async fn a_certificate_for_another_name_is_refused_as_such() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    // etcd's certificate names 127.0.0.1 only; localhost reaches the same port.
    let url = etcd.client_url().replace("127.0.0.1", "localhost");
    let client = Client::with_security([url], &etcd.security(Some(USER)))?;
    let text = tls_reason(client.check_access().await)?;
    assert!(
        text.contains("for another name, not for localhost"),
        "{text}"
    );
    Ok(())
}

#[actix_rt::test]
async fn a_missing_client_certificate_is_refused_as_such() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    let mut security = etcd.security(Some(USER));
    security.cert = None;
    security.key = None;
    let text = tls_reason(client(&etcd, &security).check_access().await)?;
    assert!(text.contains("client certificate"), "{text}");
    Ok(())
}

#[actix_rt::test]
async fn a_client_certificate_with_a_common_name_is_refused_as_such() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    let mut security = etcd.security(Some(USER));
    security.cert = Some(pki.client_cert_with_cn.clone());
    security.key = Some(pki.client_key_with_cn.clone());
    let text = tls_reason(client(&etcd, &security).check_access().await)?;
    assert!(text.contains("Common Name"), "{text}");
    Ok(())
}

#[actix_rt::test]
async fn a_user_without_the_role_cannot_write_the_leader_key() -> Result<()> {
    let pki = Pki::new();
    let etcd = secured(&pki, None);
    etcd.add_user("outsider", "outsider-password", None);
    let outsider = client(
        &etcd,
        &etcd.security(Some(("outsider", "outsider-password"))),
    );
    outsider
        .check_access()
        .await
        .context("the password is right")?;
    for attempt in [
        outsider.put(LEADER, b"usurper", None).await.map(|_| ()),
        outsider
            .txn(&Txn::new().and_then([Op::put(LEADER, b"usurper", None)]))
            .await
            .map(|_| ()),
    ] {
        assert!(
            matches!(&attempt, Err(Error::Status { message, .. }) if message.contains("permission denied")),
            "{attempt:?}"
        );
    }
    // And without a password at all, the client certificate alone gives no access.
    let anonymous = client(&etcd, &etcd.security(None));
    let attempt = anonymous.put(LEADER, b"usurper", None).await;
    assert!(matches!(&attempt, Err(Error::Status { .. })), "{attempt:?}");
    let root = etcd.client();
    assert!(root.range(&KeyRange::key(LEADER)).await?.kvs.is_empty());
    Ok(())
}

/// etcd forgets a simple token `--auth-token-ttl` after its last use; the next calls (a put
/// and a watch) are refused for it, and the client authenticates again by itself.
#[actix_rt::test]
async fn an_expired_token_is_renewed_transparently() -> Result<()> {
    const TOKEN_TTL: Duration = Duration::from_secs(1);
    let pki = Pki::new();
    let etcd = secured(&pki, Some(TOKEN_TTL));
    let client = client(&etcd, &etcd.security(Some(USER)));
    client.put(LEADER, b"n1", None).await?;
    let first = client
        .auth_token()
        .context("a token after the first call")?;
    // Nothing is waited for here but etcd's own timeout: its keeper drops tokens unused for
    // the ttl, checking once a second, so two seconds past the ttl it is gone.
    actix_rt::time::sleep(TOKEN_TTL + Duration::from_secs(2)).await;
    client
        .put(LEADER, b"n2", None)
        .await
        .context("a put after the token expired")?;
    let second = client.auth_token().context("a token")?;
    assert_ne!(first, second, "the expired token was replaced");

    actix_rt::time::sleep(TOKEN_TTL + Duration::from_secs(2)).await;
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::key(LEADER)))
        .await
        .context("a watch after the token expired")?;
    assert_ne!(client.auth_token(), Some(second), "replaced again");
    client.put(LEADER, b"n3", None).await?;
    let batch = timeout(EVENT_DEADLINE, watch.next_batch())
        .await
        .context("a watch event before the deadline")?
        .context("the watch went on")??;
    assert_eq!(batch.events[0].kv.value, b"n3");
    Ok(())
}
