// What the settings page and the OAuth consent page share: where the
// management key is kept (this tab's sessionStorage, so signing in on
// either page signs in on both), the one way to call the gateway's JSON
// API, the message line, and how the key forms read a credit limit and
// an expiry. Loaded before each page's own script.
'use strict';

(() => {
  class ApiError extends Error {
    constructor(status, message, reason) {
      super(message);
      this.status = status;
      this.reason = reason;
    }
  }

  // One call with `key`: the answer's JSON, or an ApiError carrying the
  // gateway's own message and metadata.reason (its canonical error body).
  async function call(method, path, key, { body, headers } = {}) {
    const init = {
      method,
      headers: { Authorization: 'Bearer ' + key, ...headers },
      cache: 'no-store',
      credentials: 'omit',
      referrerPolicy: 'no-referrer',
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, 'The gateway cannot be reached (' + error.message + '); check the connection and try again.');
    }
    let json = null;
    try {
      json = await response.json();
    } catch (_) {
      // An answer that is not JSON is described by its status below.
    }
    if (!response.ok) {
      const error = json && json.error;
      const message = error && typeof error.message === 'string'
        ? error.message
        : 'The gateway answered ' + response.status + ' ' + response.statusText + '.';
      const reason = error && error.metadata ? error.metadata.reason : undefined;
      throw new ApiError(response.status, message, reason);
    }
    return json;
  }

  // Shows `text` in the page's message line; `kind` is 'ok' or 'error'.
  function say(text, kind) {
    const message = document.getElementById('message');
    message.textContent = text;
    message.className = 'message' + (kind ? ' ' + kind : '');
  }

  const LIMIT_MESSAGE = 'Credit limit must be a number of credits, such as 5 or 0.5.';
  const RATE_MESSAGE = 'A rate limit needs both a number of requests and a window in seconds, such as 60 per 60; or leave both empty.';

  // A Credit limit field: a number of credits, or null when empty.
  function limitField(input) {
    const text = input.value.trim();
    if (text === '') {
      if (input.validity && input.validity.badInput) throw new Error(LIMIT_MESSAGE);
      return null;
    }
    const value = Number(text);
    if (!Number.isFinite(value) || value < 0) throw new Error(LIMIT_MESSAGE);
    return value;
  }

  // An Allowed models field: the list the API takes, or null (every
  // model) when empty. The API checks each entry and names a bad one.
  function modelsField(input) {
    const models = input.value.split(/[\s,]+/).filter(Boolean);
    return models.length ? models : null;
  }

  // The two fields of a rate limit: {requests, window_seconds}, or null
  // when both are empty.
  function rateField(requests, window) {
    const count = requests.value.trim();
    const seconds = window.value.trim();
    if (count === '' && seconds === '') {
      if (requests.validity.badInput || window.validity.badInput) throw new Error(RATE_MESSAGE);
      return null;
    }
    if (count === '' || seconds === '') throw new Error(RATE_MESSAGE);
    return { requests: Number(count), window_seconds: Number(seconds) };
  }

  // Every time on the page is written one way: UTC, ISO-like, to the
  // minute ('2026-11-29 07:45 UTC') or, with `seconds`, to the second;
  // '–' for none or an unreadable one.
  function utcText(timestamp, seconds) {
    const iso = isoOf(timestamp);
    return iso ? iso.slice(0, 10) + ' ' + iso.slice(11, seconds ? 19 : 16) + ' UTC' : '–';
  }

  // The UTC day of an instant, 'YYYY-MM-DD'; '–' for none.
  function utcDay(timestamp) {
    const iso = isoOf(timestamp);
    return iso ? iso.slice(0, 10) : '–';
  }

  // What a datetime-local field shows for an instant: its UTC time, to
  // the minute (the Expires fields are in UTC, as every time here).
  function utcInput(timestamp) {
    const iso = isoOf(timestamp);
    return iso ? iso.slice(0, 16) : '';
  }

  // The instant in ISO 8601 (toISOString), or null.
  function isoOf(timestamp) {
    if (timestamp === null || timestamp === undefined || timestamp === '') return null;
    const when = new Date(timestamp);
    return Number.isNaN(when.getTime()) ? null : when.toISOString();
  }

  // An Expires field (datetime-local, in UTC): the instant in ISO 8601,
  // or null when empty.
  function expiresField(input) {
    if (!input.value) return null;
    const when = new Date(input.value + 'Z');
    if (Number.isNaN(when.getTime())) throw new Error('Expires must be a date and time.');
    return when.toISOString();
  }

  globalThis.modelgateApi = Object.freeze({
    STORAGE_KEY: 'modelgate.managementKey',
    ApiError,
    call,
    say,
    limitField,
    expiresField,
    modelsField,
    rateField,
    utcText,
    utcDay,
    utcInput,
  });
})();
