//! `walserver run`: a node from a configuration, with the admin API and signal handling.
//!
//! Signals become messages to the supervisor: SIGTERM and SIGINT ask for a fast shutdown
//! (a second one, or SIGQUIT, for an immediate one), SIGHUP for a reload.

use std::sync::Arc;

use anyhow::{bail, Context};
use supervisor_actor::{Node, ShutdownNode};
use walserver_node::config::{Settings, Sources};
use walserver_node::node::{resolve_addr, start_node, Reloader};

use crate::http::ReloadAction;

/// What SIGTERM/SIGINT do first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StopMode {
    Fast,
    Immediate,
}

/// Runs a node until it is shut down. Must be called outside any async runtime.
pub fn run(settings: Settings, sources: Sources, stop_mode: StopMode) -> anyhow::Result<()> {
    let data_dir = settings.resolve_data_dir(sources.file.as_deref());
    let http_addr = resolve_addr(&settings.http_listen, "http_listen")?;
    if !http_addr.ip().is_loopback() && settings.http_auth_token.as_deref().unwrap_or("").is_empty()
    {
        bail!(
            "http_listen {http_addr} is not a loopback address: set http_auth_token so the admin API is not open to anyone who can reach it"
        );
    }
    let start = start_node(&settings, &data_dir, |_| {})?;
    let reloader = Arc::new(Reloader {
        sources,
        data_dir,
        running: settings.clone(),
    });
    let system = actix_rt::System::new();
    system.block_on(async move {
        // The handlers are in place before the log says the node is up, so that a signal
        // sent on seeing that line is handled rather than killing the process.
        let signals = Signals::install()?;
        crate::failover::check_etcd_access(&settings).await?;
        crate::failover::check_member_name(&settings).await?;
        let node = start.await?;
        let reload: ReloadAction = {
            let (reloader, node) = (reloader.clone(), node.clone());
            Arc::new(move || {
                let (reloader, node) = (reloader.clone(), node.clone());
                Box::pin(async move { Ok(reloader.reload(&node).await?) })
            })
        };
        let http = crate::http::serve(&settings, http_addr, &node, Some(reload))?;
        tracing::info!(addr = %http, "admin API listening");
        // The supervisor stops the admin API in the node's shutdown order.
        wait_for_signals(signals, &node, stop_mode, &reloader).await?;
        Ok::<(), anyhow::Error>(())
    })
}

/// The signals `walserver run` handles.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

async fn wait_for_signals(
    signals: Signals,
    node: &Node,
    stop_mode: StopMode,
    reloader: &Reloader,
) -> anyhow::Result<()> {
    let Signals {
        mut term,
        mut int,
        mut quit,
        mut hup,
    } = signals;
    let mut shutdown: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let immediate = tokio::select! {
            _ = term.recv() => shutdown.is_some() || stop_mode == StopMode::Immediate,
            _ = int.recv() => shutdown.is_some() || stop_mode == StopMode::Immediate,
            _ = quit.recv() => true,
            _ = hup.recv() => {
                if let Err(e) = reloader.reload(node).await {
                    // Through anyhow, whose `{:#}` adds the causes after the message.
                    tracing::error!("{:#}", anyhow::Error::from(e));
                }
                continue;
            }
            r = async { shutdown.as_mut().expect("guarded by the precondition").await }, if shutdown.is_some() => {
                r.context("shutdown task failed")?;
                return Ok(());
            }
        };
        let sup = node.supervisor.clone();
        tracing::info!(immediate, "shutdown requested by signal");
        let task = actix_rt::spawn(async move {
            let _ = sup.send(ShutdownNode { immediate }).await;
        });
        if shutdown.is_none() {
            shutdown = Some(task);
        }
    }
}
