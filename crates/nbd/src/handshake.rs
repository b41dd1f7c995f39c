//! The handshake phase: the fixed-newstyle greeting and option haggling that ends
//! with an export chosen (by `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`) or with the
//! connection closed. Parsing is done by the pure functions in [`crate::wire`];
//! this file only moves bytes and keeps the negotiation state.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::access::{Access, ConnectionSecurity, ReadOnlyExport};
use crate::backend::{Export, ExportCatalog, ExportSummary};
use crate::config::{PREFERRED_BLOCK_BYTES, ServerConfig};
use crate::error::ConnectionError;
use crate::negotiated::Negotiated;
use crate::tls::Transport;
use crate::wire::{self, InfoRequest, MetaContextRequest, OptionRequest, TransmissionContext};

/// How the handshake ended.
pub(crate) enum HandshakeOutcome {
    Transmission(Negotiated),
    /// The client aborted (`NBD_OPT_ABORT`) or went away between options.
    Closed,
}

/// The transmission flags for `export`, given whether structured replies were
/// negotiated (`NBD_FLAG_SEND_DF` needs them).
pub fn transmission_flags(export: &dyn Export, structured_replies: bool) -> u16 {
    let mut flags = wire::TRANSMISSION_FLAG_HAS_FLAGS
        | wire::TRANSMISSION_FLAG_SEND_FLUSH
        | wire::TRANSMISSION_FLAG_SEND_FUA
        | wire::TRANSMISSION_FLAG_SEND_CACHE
        // The backend's flush covers writes made on every connection.
        | wire::TRANSMISSION_FLAG_CAN_MULTI_CONN;
    if export.read_only() {
        flags |= wire::TRANSMISSION_FLAG_READ_ONLY;
    } else {
        flags |= wire::TRANSMISSION_FLAG_SEND_TRIM
            | wire::TRANSMISSION_FLAG_SEND_WRITE_ZEROES
            | wire::TRANSMISSION_FLAG_SEND_FAST_ZERO;
    }
    if structured_replies {
        flags |= wire::TRANSMISSION_FLAG_SEND_DF;
    }
    flags
}

struct State {
    no_zeroes: bool,
    structured_replies: bool,
    /// The canonical name of the export `base:allocation` was selected for.
    base_allocation_export: Option<String>,
    /// The slots a connection takes one of when it enters transmission; `None`
    /// when the caller sets no limit.
    transmission_slots: Option<Arc<Semaphore>>,
    /// TLS, the access policy and who the client is.
    security: ConnectionSecurity,
    /// Exports named by this handshake's largest `NBD_OPT_LIST` reply: the
    /// client may ask about each, beyond `handshake_options_max`.
    listed_exports_max: u32,
    /// Whether the policy admits this client at all (`Err`: why not); asked
    /// again after STARTTLS, which may name the client by its certificate.
    admission: Result<(), String>,
}

/// Asks the connection's policy whether its client may use the server.
fn admission(security: &ConnectionSecurity) -> Result<(), String> {
    match &security.access {
        Some(policy) => policy.admit(&security.identity),
        None => Ok(()),
    }
}

impl State {
    /// The export `name` if it exists and this client may open it, read-only
    /// when that is all it was granted.
    fn open(
        &self,
        catalog: &dyn ExportCatalog,
        name: &str,
    ) -> Option<(ExportSummary, Arc<dyn Export>)> {
        self.admission.as_ref().ok()?;
        let (summary, export) = catalog.open(name)?;
        let Some(policy) = &self.security.access else {
            return Some((summary, export));
        };
        match policy.access(&self.security.identity, &summary.name)? {
            Access::ReadWrite => Some((summary, export)),
            Access::ReadOnly => {
                let read_only: Arc<dyn Export> = Arc::new(ReadOnlyExport { inner: export });
                Some((summary, read_only))
            }
        }
    }

    /// Whether this client may see the export `name` in a listing.
    fn may_list(&self, name: &str) -> bool {
        if self.admission.is_err() {
            return false;
        }
        match &self.security.access {
            None => true,
            Some(policy) => policy.access(&self.security.identity, name).is_some(),
        }
    }

    /// The reply to an option naming an export [`State::open`] refused: with
    /// an access policy, `NBD_REP_ERR_POLICY` whether it exists or not (so a
    /// client cannot probe for names); without one, `NBD_REP_ERR_UNKNOWN`.
    /// A client the policy does not admit is told why instead.
    fn refusal(&self, name: &str) -> (u32, String) {
        if let Err(reason) = &self.admission {
            return (wire::REP_ERR_POLICY, reason.clone());
        }
        if self.security.access.is_some() {
            (
                wire::REP_ERR_POLICY,
                format!("export {name:?} does not exist or this client may not open it"),
            )
        } else {
            (wire::REP_ERR_UNKNOWN, format!("no export named {name:?}"))
        }
    }

    /// Takes a transmission slot for a handshake about to complete. Taken only
    /// now, so that connections still haggling never hold one.
    fn claim_transmission_slot(
        &self,
        config: &ServerConfig,
    ) -> Result<Option<OwnedSemaphorePermit>, ConnectionError> {
        match &self.transmission_slots {
            None => Ok(None),
            Some(slots) => Arc::clone(slots)
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| ConnectionError::ConnectionLimit(config.connections_max)),
        }
    }
}

/// Runs the handshake to its end. Errors mean the connection must be closed.
/// A handshake that chooses an export takes one of `transmission_slots` (when
/// given) before its final reply, and fails if none is left.
pub(crate) async fn run<S>(
    stream: &mut Transport<S>,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    security: ConnectionSecurity,
    transmission_slots: Option<Arc<Semaphore>>,
) -> Result<HandshakeOutcome, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&wire::encode_greeting()).await?;
    stream.flush().await?;
    let mut flag_bytes = [0u8; 4];
    stream.read_exact(&mut flag_bytes).await?;
    let client_flags = wire::parse_client_flags(&flag_bytes)?;
    let mut state = State {
        no_zeroes: client_flags.no_zeroes,
        structured_replies: false,
        base_allocation_export: None,
        transmission_slots,
        admission: admission(&security),
        security,
        listed_exports_max: 0,
    };
    let mut option_count: u32 = 0;
    loop {
        let Some(header) = read_option_header(stream).await? else {
            return Ok(HandshakeOutcome::Closed);
        };
        option_count = option_count.saturating_add(1);
        let options_allowed = config.handshake_options_allowed(state.listed_exports_max);
        refuse_over_limits(stream, config, header, option_count, options_allowed).await?;
        let data_len =
            usize::try_from(header.data_bytes).map_err(|_| ConnectionError::OptionTooBig {
                option: header.option,
                data_bytes: header.data_bytes,
                limit_bytes: config.option_bytes_max,
            })?;
        let mut data = vec![0u8; data_len];
        stream.read_exact(&mut data).await?;
        if refuse_before_tls(stream, &state.security, header.option).await? {
            continue;
        }
        let Some(request) = parse_or_refuse(stream, header.option, &data).await? else {
            continue;
        };
        if let Some(outcome) =
            handle(stream, catalog, config, &mut state, header.option, request).await?
        {
            return Ok(outcome);
        }
    }
}

/// Under `tls = "require"`, before STARTTLS: answers every option other than
/// STARTTLS and ABORT with `NBD_REP_ERR_TLS_REQD` and returns true (the option
/// is done). `NBD_OPT_EXPORT_NAME` has no error reply, so it closes instead.
async fn refuse_before_tls<S>(
    stream: &mut Transport<S>,
    security: &ConnectionSecurity,
    option: u32,
) -> Result<bool, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let required = security.tls.as_ref().is_some_and(|tls| tls.required());
    if !required || stream.is_tls() || matches!(option, wire::OPT_STARTTLS | wire::OPT_ABORT) {
        return Ok(false);
    }
    if option == wire::OPT_EXPORT_NAME {
        return Err(ConnectionError::TlsRequired);
    }
    send(
        stream,
        option,
        wire::REP_ERR_TLS_REQD,
        b"this server requires TLS: send NBD_OPT_STARTTLS first",
    )
    .await?;
    Ok(true)
}

/// Reads the next option header; `None` when the client hung up between
/// options, which it may.
async fn read_option_header<S>(
    stream: &mut S,
) -> Result<Option<wire::OptionHeader>, ConnectionError>
where
    S: AsyncRead + Unpin,
{
    let mut header_bytes = [0u8; wire::OPTION_HEADER_BYTES];
    match stream.read_exact(&mut header_bytes).await {
        Ok(_) => Ok(Some(wire::parse_option_header(&header_bytes)?)),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Says why and fails when the option is one over `options_allowed` for this
/// handshake or its data is over `option_bytes_max`; the connection is then
/// closed.
async fn refuse_over_limits<S>(
    stream: &mut S,
    config: &ServerConfig,
    header: wire::OptionHeader,
    option_count: u32,
    options_allowed: u32,
) -> Result<(), ConnectionError>
where
    S: AsyncWrite + Unpin,
{
    if option_count > options_allowed {
        send(
            stream,
            header.option,
            wire::REP_ERR_POLICY,
            b"too many options in one handshake",
        )
        .await?;
        return Err(ConnectionError::TooManyOptions(options_allowed));
    }
    if header.data_bytes > config.option_bytes_max {
        // Skipping the data would let a client make the server read gigabytes;
        // say why and hang up instead.
        let message = format!(
            "option data of {} bytes is over the {}-byte limit",
            header.data_bytes, config.option_bytes_max
        );
        send(
            stream,
            header.option,
            wire::REP_ERR_TOO_BIG,
            message.as_bytes(),
        )
        .await?;
        return Err(ConnectionError::OptionTooBig {
            option: header.option,
            data_bytes: header.data_bytes,
            limit_bytes: config.option_bytes_max,
        });
    }
    Ok(())
}

/// Parses an option's data. Malformed data gets `NBD_REP_ERR_INVALID` and
/// `None` (the handshake goes on), except for `NBD_OPT_EXPORT_NAME`, which has
/// no error reply: the only answer is to close.
async fn parse_or_refuse<'a, S>(
    stream: &mut S,
    option: u32,
    data: &'a [u8],
) -> Result<Option<OptionRequest<'a>>, ConnectionError>
where
    S: AsyncWrite + Unpin,
{
    match wire::parse_option(option, data) {
        Ok(request) => Ok(Some(request)),
        Err(error) if option == wire::OPT_EXPORT_NAME => Err(ConnectionError::Wire(error)),
        Err(error) => {
            tracing::debug!(option, %error, "malformed option");
            send(
                stream,
                option,
                wire::REP_ERR_INVALID,
                error.to_string().as_bytes(),
            )
            .await?;
            Ok(None)
        }
    }
}

async fn send<S>(
    stream: &mut S,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> Result<(), ConnectionError>
where
    S: AsyncWrite + Unpin,
{
    stream
        .write_all(&wire::encode_option_reply(option, reply_type, data))
        .await?;
    stream.flush().await?;
    Ok(())
}

/// Handles one parsed option; `Some` ends the handshake.
async fn handle<S>(
    stream: &mut Transport<S>,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    state: &mut State,
    option: u32,
    request: OptionRequest<'_>,
) -> Result<Option<HandshakeOutcome>, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match request {
        OptionRequest::ExportName(name) => {
            let negotiated = export_name(stream, catalog, config, state, name).await?;
            Ok(Some(HandshakeOutcome::Transmission(negotiated)))
        }
        OptionRequest::Abort => {
            // The client may already have closed; a failed ACK changes nothing.
            let _ = send(stream, option, wire::REP_ACK, &[]).await;
            Ok(Some(HandshakeOutcome::Closed))
        }
        OptionRequest::List => {
            let listed = list(stream, catalog, state, option).await?;
            state.listed_exports_max = state.listed_exports_max.max(listed);
            Ok(None)
        }
        OptionRequest::StartTls => {
            start_tls(stream, state, option).await?;
            Ok(None)
        }
        OptionRequest::StructuredReply => {
            state.structured_replies = true;
            send(stream, option, wire::REP_ACK, &[]).await?;
            Ok(None)
        }
        OptionRequest::Info(info) => {
            info_or_go(stream, catalog, config, state, option, info, false).await
        }
        OptionRequest::Go(info) => {
            info_or_go(stream, catalog, config, state, option, info, true).await
        }
        OptionRequest::ListMetaContext(request) => {
            meta_context(stream, catalog, state, option, request, false).await?;
            Ok(None)
        }
        OptionRequest::SetMetaContext(request) => {
            meta_context(stream, catalog, state, option, request, true).await?;
            Ok(None)
        }
        OptionRequest::Unknown(unknown) => {
            tracing::debug!(option = unknown, "unsupported option");
            let message = format!("option {unknown} is not supported");
            send(stream, option, wire::REP_ERR_UNSUP, message.as_bytes()).await?;
            Ok(None)
        }
    }
}

/// `NBD_OPT_STARTTLS`: without TLS configured, `NBD_REP_ERR_UNSUP`; a second
/// one, `NBD_REP_ERR_INVALID`; otherwise the ACK and the TLS handshake, whose
/// failure closes the connection (the spec: no way back to plain text). What
/// was negotiated in plain text is forgotten, so that a man in the middle
/// cannot have chosen it.
async fn start_tls<S>(
    stream: &mut Transport<S>,
    state: &mut State,
    option: u32,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(tls) = state.security.tls.clone() else {
        return send(
            stream,
            option,
            wire::REP_ERR_UNSUP,
            b"TLS is not enabled on this listener",
        )
        .await;
    };
    if stream.is_tls() {
        return send(
            stream,
            option,
            wire::REP_ERR_INVALID,
            b"TLS is already running",
        )
        .await;
    }
    send(stream, option, wire::REP_ACK, &[]).await?;
    stream.start_tls(&tls).await.map_err(ConnectionError::Tls)?;
    state.structured_replies = false;
    state.base_allocation_export = None;
    state.security.identity.tls = true;
    state.security.identity.certificate_dn = stream.peer_certificate_dn();
    state.admission = admission(&state.security);
    tracing::debug!(identity = %state.security.identity, "TLS started");
    Ok(())
}

/// `NBD_OPT_EXPORT_NAME`: chooses the export and ends the handshake. It has
/// no error reply, so an unknown export or a missing slot closes.
async fn export_name<S>(
    stream: &mut S,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    state: &State,
    name: &str,
) -> Result<Negotiated, ConnectionError>
where
    S: AsyncWrite + Unpin,
{
    let Some((summary, export)) = state.open(catalog, name) else {
        return Err(ConnectionError::UnknownExport(name.to_string()));
    };
    let slot = state.claim_transmission_slot(config)?;
    let mut negotiated = negotiated(state, config, summary, export);
    negotiated.transmission_slot = slot;
    let flags = transmission_flags(negotiated.export.as_ref(), state.structured_replies);
    stream
        .write_all(&wire::encode_export_name_reply(
            negotiated.context.export_size_bytes,
            flags,
            state.no_zeroes,
        ))
        .await?;
    stream.flush().await?;
    Ok(negotiated)
}

/// `NBD_OPT_LIST`: one `NBD_REP_SERVER` per export, then the ACK. Returns
/// how many exports it named.
async fn list<S>(
    stream: &mut S,
    catalog: &dyn ExportCatalog,
    state: &State,
    option: u32,
) -> Result<u32, ConnectionError>
where
    S: AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    let mut listed: u32 = 0;
    for entry in catalog.list() {
        if !state.may_list(&entry.name) {
            continue;
        }
        out.extend_from_slice(&wire::encode_option_reply(
            option,
            wire::REP_SERVER,
            &wire::encode_server_entry(&entry.name, &entry.description),
        ));
        listed = listed.saturating_add(1);
    }
    out.extend_from_slice(&wire::encode_option_reply(option, wire::REP_ACK, &[]));
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(listed)
}

fn negotiated(
    state: &State,
    config: &ServerConfig,
    summary: ExportSummary,
    export: Arc<dyn Export>,
) -> Negotiated {
    // Contexts selected for another export do not carry over (the spec ties them
    // to the export named in NBD_OPT_SET_META_CONTEXT).
    let base_allocation = state.structured_replies
        && state.base_allocation_export.as_deref() == Some(summary.name.as_str());
    let context = TransmissionContext {
        export_size_bytes: export.size_bytes(),
        read_only: export.read_only(),
        structured_replies: state.structured_replies,
        base_allocation,
        max_request_bytes: config.max_request_bytes,
    };
    Negotiated {
        export,
        summary,
        context,
        transmission_slot: None,
    }
}

async fn info_or_go<S>(
    stream: &mut S,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    state: &mut State,
    option: u32,
    info: InfoRequest<'_>,
    go: bool,
) -> Result<Option<HandshakeOutcome>, ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some((summary, export)) = state.open(catalog, info.export_name) else {
        let (reply, message) = state.refusal(info.export_name);
        send(stream, option, reply, message.as_bytes()).await?;
        return Ok(None);
    };
    let mut negotiated = negotiated(state, config, summary, export);
    if go {
        match state.claim_transmission_slot(config) {
            Ok(slot) => negotiated.transmission_slot = slot,
            Err(error) => {
                let message = format!(
                    "the server is serving its limit of {} connections",
                    config.connections_max
                );
                send(stream, option, wire::REP_ERR_POLICY, message.as_bytes()).await?;
                return Err(error);
            }
        }
    }
    let flags = transmission_flags(negotiated.export.as_ref(), state.structured_replies);
    let mut out = wire::encode_option_reply(
        option,
        wire::REP_INFO,
        &wire::encode_info_export(negotiated.context.export_size_bytes, flags),
    );
    if info.requested.contains(&wire::INFO_NAME) {
        out.extend_from_slice(&wire::encode_option_reply(
            option,
            wire::REP_INFO,
            &wire::encode_info_text(wire::INFO_NAME, &negotiated.summary.name),
        ));
    }
    if info.requested.contains(&wire::INFO_DESCRIPTION)
        && !negotiated.summary.description.is_empty()
    {
        out.extend_from_slice(&wire::encode_option_reply(
            option,
            wire::REP_INFO,
            &wire::encode_info_text(wire::INFO_DESCRIPTION, &negotiated.summary.description),
        ));
    }
    // Block sizes are always sent: any length from one byte up to the maximum is
    // accepted, and 4 KiB is what the storage below prefers.
    out.extend_from_slice(&wire::encode_option_reply(
        option,
        wire::REP_INFO,
        &wire::encode_info_block_size(1, PREFERRED_BLOCK_BYTES, config.max_request_bytes),
    ));
    out.extend_from_slice(&wire::encode_option_reply(option, wire::REP_ACK, &[]));
    stream.write_all(&out).await?;
    stream.flush().await?;
    if go {
        Ok(Some(HandshakeOutcome::Transmission(negotiated)))
    } else {
        Ok(None)
    }
}

async fn meta_context<S>(
    stream: &mut S,
    catalog: &dyn ExportCatalog,
    state: &mut State,
    option: u32,
    request: MetaContextRequest<'_>,
    set: bool,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if !state.structured_replies {
        return send(
            stream,
            option,
            wire::REP_ERR_INVALID,
            b"negotiate structured replies first",
        )
        .await;
    }
    if let Some(query) = request.queries.iter().find(|query| !query.contains(':')) {
        let message = format!("query {query:?} has no namespace");
        return send(stream, option, wire::REP_ERR_INVALID, message.as_bytes()).await;
    }
    let Some((summary, _export)) = state.open(catalog, request.export_name) else {
        let (reply, message) = state.refusal(request.export_name);
        return send(stream, option, reply, message.as_bytes()).await;
    };
    let selected = if set {
        request.queries.contains(&wire::BASE_ALLOCATION)
    } else {
        // Listing with no query lists everything; `base:` lists the whole namespace.
        request.queries.is_empty()
            || request
                .queries
                .iter()
                .any(|query| *query == "base:" || *query == wire::BASE_ALLOCATION)
    };
    let mut out = Vec::new();
    if selected {
        let context_id = if set {
            wire::BASE_ALLOCATION_CONTEXT_ID
        } else {
            0
        };
        out.extend_from_slice(&wire::encode_option_reply(
            option,
            wire::REP_META_CONTEXT,
            &wire::encode_meta_context(context_id, wire::BASE_ALLOCATION),
        ));
    }
    if set {
        state.base_allocation_export = selected.then(|| summary.name.clone());
    }
    out.extend_from_slice(&wire::encode_option_reply(option, wire::REP_ACK, &[]));
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(())
}
