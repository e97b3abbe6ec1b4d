//! The outbound hooks' wiring: the webhooks' service and the pre-commit
//! hook, from the settings.

use std::sync::Arc;

use secrecy::ExposeSecret;

use crate::{
    config::Settings,
    coord::members::Members,
    domain::{
        links::LinkSigner,
        upload::PrecommitHook,
        webhooks::{WebhookPorts, Webhooks},
    },
    hooks::{Caller, Signer},
    ports::Ports,
    redis_link::RedisLink,
};

/// The pre-commit hook, when `FILEDOCK_PRECOMMIT_HOOK_URL` is set: its read
/// URLs signed with `links`, on `FILEDOCK_PUBLIC_URL` (else the listen
/// address).
pub(super) fn precommit_hook(
    settings: &Settings,
    links: Arc<LinkSigner>,
    ports: &Ports,
) -> anyhow::Result<Option<Arc<PrecommitHook>>> {
    let Some(hook) = &settings.precommit else {
        return Ok(None);
    };
    let signer = Signer::from_secret(hook.secret.expose_secret())
        .map_err(|e| anyhow::anyhow!("FILEDOCK_WEBHOOK_SECRET {e}"))?;
    let caller = Caller::new(signer, hook.timeout)?;
    // The read URLs must reach this service from the hook, at whichever
    // instance: a production server refuses to start without what that
    // takes; a development one warns.
    let missing = [
        (
            links.ephemeral,
            "FILEDOCK_LINK_SECRET (read URLs would work only on the instance that made them)",
        ),
        (
            settings.public_url.is_none(),
            "FILEDOCK_PUBLIC_URL (read URLs would be built on the listen address)",
        ),
    ];
    for (_, what) in missing.iter().filter(|(missing, _)| *missing) {
        if settings.is_production() {
            anyhow::bail!("FILEDOCK_PRECOMMIT_HOOK_URL needs {what}");
        }
        tracing::warn!("FILEDOCK_PRECOMMIT_HOOK_URL without {what}");
    }
    let base = match &settings.public_url {
        Some(url) => url.clone(),
        None => format!("http://{}", settings.bind),
    };
    Ok(Some(Arc::new(PrecommitHook::new(
        hook,
        caller,
        (links, base),
        ports.blobs.clone(),
        ports.metrics.clone(),
    ))))
}

/// The webhooks' service: its signer and caller from the settings, and on
/// Redis (when set) the members among which the partitions are shared.
pub(super) fn webhook_service(
    settings: &Settings,
    mut ports: WebhookPorts,
) -> anyhow::Result<Webhooks> {
    let Some(w) = &settings.webhooks else {
        return Ok(Webhooks::new(None, ports));
    };
    let signer = Signer::from_secret(w.secret.expose_secret())
        .map_err(|e| anyhow::anyhow!("FILEDOCK_WEBHOOK_SECRET {e}"))?;
    let caller = Caller::new(signer, w.timeout)?;
    let conn = RedisLink::from_settings(settings)?
        .map(|link| link.counted(ports.metrics.redis_commands.clone()).conn());
    if conn.is_none() && settings.mongodb_uri.is_some() {
        tracing::warn!(
            "webhooks without FILEDOCK_REDIS_URL: their partitions are leased in this process only; \
             run one instance on this MongoDB, or each one delivers every event"
        );
    }
    let instance = format!("filedock-{}", uuid::Uuid::new_v4().simple());
    let key = format!("{}filedock_webhook_members", settings.redis_prefix);
    ports.members = Members::new(conn, key, instance);
    Ok(Webhooks::new(Some((w.clone(), caller)), ports))
}
