// The consent page of the OAuth flow (/auth): an app sent the person here
// with its callback URL and PKCE challenge; signed in with a management
// key, the person authorizes a key for the app (optionally with a credit
// limit, a reset period and an expiry) or denies it. Plain JavaScript, no
// framework, no build step. The key is the settings page's: kept in this
// tab's sessionStorage under the same name, so signing in on either page
// signs in on both. Everything shown is written with textContent, never
// parsed as HTML: the app's URL comes from whoever made the link.
'use strict';

(() => {
  const { STORAGE_KEY, ApiError, say, limitField, expiresField } = globalThis.modelgateApi;
  // The gateway's own rules (src/oauth/input.rs, pkce.rs), checked here
  // first so a bad link never shows an Authorize button.
  const MAX_CALLBACK_URL_BYTES = 2048;
  const LOOPBACK_HOSTS = ['localhost', '127.0.0.1', '[::1]'];
  const CHALLENGES = {
    S256: /^[A-Za-z0-9_-]{43}$/,
    plain: /^[A-Za-z0-9._~-]{43,128}$/,
  };
  const INFERENCE_KEY =
    'This is an inference key: it calls models but cannot authorize apps. ' +
    'Sign in with a management key: the operator\'s key, or an account management key the operator made for you.';

  const $ = (id) => document.getElementById(id);

  // The checked request: { callback: URL, challenge, method } (method
  // null when the app named none).
  let request = null;
  // Who is signed in: { key, operator, account }.
  let session = null;

  // ---- the request in the address bar --------------------------------

  class RequestError extends Error {}

  // The one value of parameter `name`; absent is null, twice is an error.
  function single(params, name) {
    const values = params.getAll(name);
    if (values.length > 1) throw new RequestError('the parameter ' + name + ' is given more than once.');
    return values.length === 1 ? values[0] : null;
  }

  // The callback URL under the gateway's rules, or a RequestError saying
  // what is wrong. Never a javascript:, data: or other scheme.
  function callbackUrl(text) {
    if (text === null || text === '') throw new RequestError('callback_url is missing: the app must say where to send you back.');
    if (new TextEncoder().encode(text).length > MAX_CALLBACK_URL_BYTES) throw new RequestError('callback_url is over ' + MAX_CALLBACK_URL_BYTES + ' bytes.');
    // The URL parser would drop spaces and control characters silently.
    if (!/^[\x21-\x7e]+$/.test(text)) throw new RequestError('callback_url must be visible ASCII without spaces.');
    if (text.includes('#')) throw new RequestError('callback_url must not contain a #fragment.');
    let url;
    try {
      url = new URL(text);
    } catch (_) {
      throw new RequestError('callback_url is not an absolute URL.');
    }
    if (url.protocol === 'http:') {
      if (!LOOPBACK_HOSTS.includes(url.hostname)) {
        throw new RequestError('callback_url may use http:// only for localhost, 127.0.0.1 or [::1]; any other host needs https://.');
      }
    } else if (url.protocol !== 'https:') {
      throw new RequestError('callback_url must start with https:// (or http:// on this machine).');
    }
    if (!url.hostname) throw new RequestError('callback_url has no host.');
    // Some characters are percent-encoded by the parser: the URL sent on
    // is held to the bound too.
    if (url.href.length > MAX_CALLBACK_URL_BYTES) throw new RequestError('callback_url is over ' + MAX_CALLBACK_URL_BYTES + ' bytes.');
    if (url.username || url.password) throw new RequestError('callback_url must not contain a user name or password.');
    return url;
  }

  function readRequest() {
    const params = new URLSearchParams(location.search);
    const callback = callbackUrl(single(params, 'callback_url'));
    // RFC 7636: no method named means plain. Whether the gateway takes
    // plain is the operator's choice (by default it takes S256 only), so
    // the approval carries what the app named, and the gateway's answer
    // says what to do.
    const named = single(params, 'code_challenge_method');
    const method = named || 'plain';
    if (!Object.hasOwn(CHALLENGES, method)) throw new RequestError('code_challenge_method must be S256 or plain.');
    const challenge = single(params, 'code_challenge');
    if (challenge === null || challenge === '') throw new RequestError('code_challenge is missing: the app must send its PKCE challenge.');
    if (!CHALLENGES[method].test(challenge)) {
      throw new RequestError(method === 'S256'
        ? 'code_challenge must be 43 base64url characters: the SHA-256 of the app\'s code_verifier.'
        : 'code_challenge must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~.');
    }
    return { callback, challenge, method: named };
  }

  // ---- the API ------------------------------------------------------

  // One call: see api.js.
  const api = (method, path, key, body) =>
    globalThis.modelgateApi.call(method, path, key, { body });

  // ---- messages -----------------------------------------------------

  const sayError = (text) => say(text, 'error');

  // ---- signing in and out -------------------------------------------

  async function signIn(key) {
    const me = (await api('GET', '/api/v1/key', key)).data;
    if (me.management !== true) throw new ApiError(403, INFERENCE_KEY);
    sessionStorage.setItem(STORAGE_KEY, key);
    session = {
      key,
      operator: me.operator === true,
      account: typeof me.account === 'string' ? me.account : null,
    };
    $('management-key').value = '';
    $('sign-in').hidden = true;
    $('sign-out').hidden = false;
    $('consent').hidden = false;
    for (const node of document.querySelectorAll('.operator-only')) node.hidden = !session.operator;
    $('consent-account').required = session.operator;
    const who = $('who');
    who.hidden = false;
    who.textContent = session.operator
      ? 'Operator key “' + me.label + '”'
      : 'Key “' + me.label + '”' + (session.account ? ' of the account ' + session.account : '');
    (session.operator ? $('consent-account') : $('consent-limit')).focus();
  }

  function signOut() {
    sessionStorage.removeItem(STORAGE_KEY);
    session = null;
    for (const id of ['consent', 'sign-out', 'who']) $(id).hidden = true;
    $('sign-in').hidden = false;
    $('management-key').focus();
  }

  // ---- deciding -----------------------------------------------------

  // Sends the browser back to the app with `name=value` added to the
  // callback URL's query, its other parameters kept.
  function back(name, value) {
    const url = new URL(request.callback.href);
    url.searchParams.set(name, value);
    location.assign(url.href);
  }

  async function authorize() {
    const body = {
      callback_url: request.callback.href,
      code_challenge: request.challenge,
    };
    if (request.method !== null) body.code_challenge_method = request.method;
    const name = $('consent-name').value.trim();
    if (name) body.key_label = name;
    const limit = limitField($('consent-limit'));
    if (limit !== null) body.limit = limit;
    if ($('consent-reset').value) body.limit_reset = $('consent-reset').value;
    const expires = expiresField($('consent-expires'));
    if (expires !== null) body.expires_at = expires;
    if (session.operator) {
      const account = $('consent-account').value.trim();
      if (!account) throw new Error('Account is required: name the account whose key the app gets.');
      body.account = account;
    }
    const created = await api('POST', '/api/v1/auth/keys/code', session.key, body);
    say('Authorized. Taking you back to the app…', 'ok');
    back('code', created.data.id);
  }

  // ---- wiring ---------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    try {
      request = readRequest();
    } catch (error) {
      if (!(error instanceof RequestError)) throw error;
      // No way to approve a request that is not valid: the form is gone,
      // not merely hidden.
      for (const id of ['consent', 'sign-in', 'request']) $(id).remove();
      sayError('This authorization request is not valid: ' + error.message + ' Go back to the app and start again.');
      return;
    }
    $('app-origin').textContent = request.callback.origin;
    $('callback-url').textContent = request.callback.href;
    $('consent-name').placeholder = request.callback.hostname;
    $('request').hidden = false;
    $('sign-in').hidden = false;

    $('sign-in-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const key = $('management-key').value.trim();
      say('Signing in…');
      signIn(key).then(
        () => say(''),
        (error) => {
          signOut();
          sayError('Sign-in failed: ' + error.message);
        },
      );
    });
    $('sign-out').addEventListener('click', () => {
      signOut();
      say('Signed out. The key is forgotten in this tab.', 'ok');
    });
    $('consent-form').addEventListener('submit', (event) => {
      event.preventDefault();
      say('');
      const button = $('consent-form').querySelector('button[type="submit"]');
      button.disabled = true;
      authorize().catch((error) => {
        button.disabled = false;
        if (error instanceof ApiError && error.status === 401) {
          signOut();
          sayError('Your management key was refused: ' + error.message + ' Sign in again.');
          return;
        }
        sayError(error.message);
      });
    });
    // Denying tells the app so, as OAuth 2.0 does (RFC 6749, 4.1.2.1).
    $('deny').addEventListener('click', () => back('error', 'access_denied'));

    // Signed in on the key settings page in this tab: signed in here.
    const stored = sessionStorage.getItem(STORAGE_KEY);
    if (stored) {
      signIn(stored).catch((error) => {
        signOut();
        sayError('Sign in again: ' + error.message);
      });
    } else {
      $('management-key').focus();
    }
  });
})();
