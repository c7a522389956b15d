// What the settings page and the OAuth consent page share: where the
// management key is kept (this tab's sessionStorage, so signing in on
// either page signs in on both) and the one way to call the gateway's
// JSON API. Loaded before each page's own script.
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

  globalThis.modelgateApi = Object.freeze({
    STORAGE_KEY: 'modelgate.managementKey',
    ApiError,
    call,
  });
})();
