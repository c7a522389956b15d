// The key settings page. Plain JavaScript, no framework, no build step:
// it calls the gateway's JSON API with the management key the person
// pasted, which stays in this tab's sessionStorage only. Everything shown
// is written with textContent, never parsed as HTML: key and account
// names come from other people.
'use strict';

(() => {
  const {
    STORAGE_KEY, ApiError, say, limitField, expiresField, modelsField, rateField, utcText, utcDay, utcInput,
  } = globalThis.modelgateApi;
  const PAGE_SIZE = 100; // per page of GET /api/v1/keys and /api/v1/accounts
  const MAX_PAGES = 50;
  // The account every gateway has; the operator's page starts on it (the
  // operator's own key belongs to no account).
  const DEFAULT_ACCOUNT = 'default';
  // Why the key in use cannot be disabled or deleted here (the API
  // answers 409 own_key): whoever uses it would be locked out.
  const OWN_KEY = 'This is the key you are signed in with: it cannot disable or delete itself. ' +
    'A management key is the operator\'s to rotate: to replace it, ask the gateway\'s operator to rotate it ' +
    '(the new key works at once; this one works for an hour more).';
  const OWN_OPERATOR_KEY = 'This is the operator\'s key you are signed in with: it cannot disable or delete itself. ' +
    'To replace it, make a new key with "proxy keygen", set it as MODELGATE_ADMIN_KEY and restart the gateway, ' +
    'then delete this one signed in with the new key. If it is lost or leaked, run "proxy reset-operator-key".';
  const INFERENCE_KEY =
    'This is an inference key: it calls models but cannot manage keys. ' +
    'Sign in with a management key: the operator\'s key, or an account management key the operator made for you.';

  const $ = (id) => document.getElementById(id);

  // Who is signed in: the key, what GET /api/v1/key said about it, and
  // the account whose keys are shown (null: every key the key may see).
  let session = null;
  let keys = [];
  let editing = null; // the key being edited
  let rotating = null; // the key whose Rotate asks for confirmation
  let shownLeaks = ''; // what the leak notice shows (see renderLeaks)
  let generations = []; // the records the Recent generations table shows
  // Where the page of generations shown starts among the account's newest,
  // and where the next (older) one starts, if any.
  let generationsOffset = 0;
  let generationsNext = null;
  // Counted loads of each usage section: an answer that a later load
  // (another account, another period, signing out) overtook is dropped.
  let generationsLoad = 0;
  let appsLoad = 0;
  let activityLoad = 0;

  // ---- the API ------------------------------------------------------

  // One call with the signed-in key (or `key`): see api.js.
  const api = (method, path, { body, key, headers } = {}) =>
    globalThis.modelgateApi.call(method, path, key || session.key, { body, headers });

  // A route this gateway does not serve yet (an older version): a 404,
  // or the 403 a management key gets on any route outside the key API.
  const missingRoute = (error) =>
    error instanceof ApiError &&
    ((error.status === 404 && /no such endpoint/.test(error.message)) ||
      (error.status === 403 && error.reason === 'management_key'));

  // ---- messages -----------------------------------------------------

  const sayError = (text) => say(text, 'error');
  const sayDone = (text) => say(text, 'ok');

  // Runs an action, showing its error; a key refused while signed in
  // (deleted or disabled elsewhere) signs out.
  async function attempt(action) {
    try {
      await action();
    } catch (error) {
      if (session && error instanceof ApiError && error.status === 401) {
        signOut();
        sayError('Your management key was refused: ' + error.message + ' Sign in again.');
        return;
      }
      sayError(error.message);
    }
  }

  // ---- formatting ---------------------------------------------------

  // Credits to the nano-credit, as the gateway counts them.
  function credits(value) {
    if (value === null || value === undefined) return '–';
    return Number(value).toLocaleString('en-US', { maximumFractionDigits: 9 });
  }
  const day = utcDay;
  // A count (tokens, requests); '–' when unknown.
  const count = (value) => (value === null || value === undefined
    ? '–'
    : Number(value).toLocaleString('en-US'));
  // What a record's `api` is called on the page.
  const API_NAMES = { chat: 'Chat', messages: 'Messages', responses: 'Responses', embeddings: 'Embeddings' };
  // "1 request", "2 requests".
  const counted = (value, noun) => count(value) + ' ' + noun + (Number(value) === 1 ? '' : 's');
  // A limit's period as it follows the amount: "1 a day".
  const RESETS = { daily: 'a day', weekly: 'a week', monthly: 'a month' };
  const PERIOD_WORDS = { daily: 'today', weekly: 'this week', monthly: 'this month' };

  // Why a generation cost what it did, for the cost bases a person would
  // not guess (the CSV's cost_note says the same).
  const COST_NOTES = {
    lapsed: 'Charged its whole hold: the hold lapsed (the gateway instance serving the request stopped, ' +
      'or could not record its cost in time), so its usage is unknown. A late settlement replaces this charge.',
    unanswered: 'Charged its whole hold: the upstream took the request but never answered, so its usage is unknown.',
    late_answer: 'Charged the usage the upstream reported after the gateway had answered the client with an error.',
  };
  const COST_MARKS = { lapsed: 'lapsed', unanswered: 'unanswered', late_answer: 'late answer' };
  // The cost basis of a record whose hold was charged whole.
  const chargedHold = (record) => record.lapsed === true || record.cost_basis === 'lapsed' ||
    record.cost_basis === 'unanswered';

  // Who may report a key leaked (`leak.reported_by`), in words.
  const REPORTERS = { secret_scanning: 'secret scanning', operator: 'the operator' };

  function keyStatus(key) {
    // A leaked key is disabled too: say the stronger fact.
    if (key.leak) return 'leaked';
    if (key.disabled) return 'disabled';
    if (key.expires_at && Date.parse(key.expires_at) <= Date.now()) return key.rotated_to ? 'rotated' : 'expired';
    return 'active';
  }

  // A new id per purchase: a retry of the same request credits once.
  function idempotencyKey() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return 'settings-' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  // A moment in UTC as the page writes every time (utcText), to the
  // minute (last use is written at most once a minute anyway), or to the
  // second when `seconds`: its day and its time each kept whole, so a
  // narrow column breaks it only between them. The exact value stays in
  // the element, and shows as its tooltip.
  function moment(timestamp, seconds) {
    const node = document.createElement('time');
    const text = utcText(timestamp, seconds);
    const gap = text.indexOf(' ');
    node.append(element('span', text.slice(0, gap), 'day'), ' ', element('span', text.slice(gap + 1), 'clock'));
    node.dateTime = timestamp;
    node.title = timestamp;
    return node;
  }

  // Items that wrap only between each other (a model list, a rate): each
  // kept whole unless it alone is wider than its column.
  function items(label, parts, separator, className) {
    const node = element('span', label, className);
    if (label) node.append(' ');
    parts.forEach((part, index) => {
      node.append(element('span', part + (index < parts.length - 1 ? separator : ''), 'item'));
      if (index < parts.length - 1) node.append(' ');
    });
    return node;
  }

  // Each cell of the table's body labelled with its column's header, for
  // the stacked layout of a narrow window (app.css shows the label).
  function labelCells(table) {
    const headers = Array.from(table.tHead.rows[0].cells, (cell) => cell.textContent.trim());
    for (const row of table.tBodies[0].rows) {
      Array.from(row.cells).forEach((cell, index) => {
        if (headers[index] && headers[index] !== 'Actions') cell.dataset.label = headers[index];
      });
    }
  }

  function button(text, className, label, action) {
    const node = element('button', text, className);
    node.type = 'button';
    node.setAttribute('aria-label', label);
    node.addEventListener('click', action);
    return node;
  }

  // A URL from someone else (where a leaked key was found, an app's
  // address): a link only when it is a web address (a javascript: or
  // data: one stays text), opened apart from this page.
  function webLink(url) {
    let parsed = null;
    try {
      parsed = new URL(url);
    } catch (_) {
      // Not an absolute URL: shown as text.
    }
    if (!parsed || (parsed.protocol !== 'https:' && parsed.protocol !== 'http:')) return element('span', url, 'url');
    const link = element('a', url, 'url');
    link.href = url;
    link.target = '_blank';
    link.rel = 'noopener noreferrer';
    return link;
  }

  function showOperatorParts(shown) {
    for (const node of document.querySelectorAll('.operator-only')) node.hidden = !shown;
  }

  // ---- signing in and out -------------------------------------------

  async function signIn(key) {
    const me = (await api('GET', '/api/v1/key', { key })).data;
    if (me.management === false) throw new ApiError(403, INFERENCE_KEY);
    if (me.management !== true) {
      // A gateway that does not say: the management API tells.
      try {
        await api('GET', '/api/v1/keys?include_disabled=true', { key });
      } catch (error) {
        if (error.status === 403) throw new ApiError(403, INFERENCE_KEY);
        throw error;
      }
    }
    sessionStorage.setItem(STORAGE_KEY, key);
    const operator = me.operator === true;
    session = {
      key,
      me,
      operator,
      account: operator ? DEFAULT_ACCOUNT : (typeof me.account === 'string' ? me.account : null),
    };
    $('management-key').value = '';
    $('sign-in').hidden = true;
    $('sign-out').hidden = false;
    $('keys').hidden = false;
    $('accounts').hidden = !session.operator;
    showOperatorParts(session.operator);
    const who = $('who');
    who.hidden = false;
    who.textContent = session.operator
      ? 'Operator key “' + me.label + '”'
      : 'Key “' + me.label + '”' + (session.account ? ' of the account ' + session.account : '');
  }

  function signOut() {
    sessionStorage.removeItem(STORAGE_KEY);
    session = null;
    keys = [];
    editing = null;
    rotating = null;
    $('confirm-rotate').hidden = true;
    shownLeaks = '';
    $('key-rows').replaceChildren();
    $('leak-list').replaceChildren();
    $('account-rows').replaceChildren();
    generations = [];
    generationsOffset = 0;
    generationsLoad += 1;
    appsLoad += 1;
    activityLoad += 1;
    $('generation-rows').replaceChildren();
    $('app-rows').replaceChildren();
    $('activity-rows').replaceChildren();
    $('activity-chart').replaceChildren();
    $('activity-legend').replaceChildren();
    for (const id of ['account', 'keys', 'leaks', 'accounts', 'edit-key', 'new-key', 'activity', 'generations', 'apps', 'sign-out', 'who']) {
      $(id).hidden = true;
    }
    $('new-key-value').value = '';
    $('sign-in').hidden = false;
    $('management-key').focus();
  }

  // ---- what is shown ------------------------------------------------

  async function refresh() {
    const tasks = [loadAccount(), loadKeys(), loadUsage()];
    if (session.operator) tasks.push(loadAccounts());
    const results = await Promise.allSettled(tasks);
    const failed = results.find((result) => result.status === 'rejected');
    if (failed) throw failed.reason;
  }

  // The balance, free tier and free-model requests of the account shown.
  async function loadAccount() {
    const section = $('account');
    const account = session.account;
    if (session.operator && account === null) {
      section.hidden = true;
      return;
    }
    let summary;
    try {
      if (account === null) throw new ApiError(404, 'no such endpoint');
      summary = (await api('GET', '/api/v1/accounts/' + encodeURIComponent(account))).data;
    } catch (error) {
      // A gateway without the accounts API, or one that shows an account
      // only to the operator: the key's own account, from its credits and
      // its own status.
      const own = account === null || account === session.me.account;
      if (!own || !(missingRoute(error) || error.status === 403)) throw error;
      const totals = (await api('GET', '/api/v1/credits')).data;
      summary = {
        id: account,
        balance: Number(totals.total_credits) - Number(totals.total_usage),
        is_free_tier: session.me.is_free_tier,
        free_model_daily_requests: session.me.free_model_daily_requests,
      };
    }
    $('account-title').textContent = summary.id
      ? 'Account ' + summary.id + (summary.name ? ' · ' + summary.name : '')
      : 'Your account';
    $('account-balance').textContent = credits(summary.balance) + ' credits';
    $('account-free-tier').textContent = summary.is_free_tier
      ? 'Yes: no credits bought yet'
      : 'No';
    const free = summary.free_model_daily_requests;
    $('account-free-requests').textContent = free
      ? free.remaining + ' of ' + free.limit
      : '–';
    section.hidden = false;
  }

  // Every page of a list.
  async function allPages(path) {
    const joiner = path.includes('?') ? '&' : '?';
    const all = [];
    for (let page = 0; page < MAX_PAGES; page += 1) {
      const batch = (await api('GET', path + joiner + 'offset=' + all.length)).data;
      all.push(...batch);
      if (batch.length < PAGE_SIZE) break;
    }
    return all;
  }

  async function loadKeys() {
    let query = '?include_disabled=true';
    if (session.operator && session.account !== null) query += '&account=' + encodeURIComponent(session.account);
    keys = await allPages('/api/v1/keys' + query);
    renderKeys();
  }

  // What the limit counts: the usage of its period (all time without
  // one), with BYOK usage when the key counts it.
  function limitUsed(key) {
    if (key.limit !== null && key.limit_remaining !== null && key.limit_remaining !== undefined) {
      return Math.max(0, key.limit - key.limit_remaining);
    }
    return 0;
  }

  function renderKeys() {
    const rows = keys.map((key) => {
      const row = document.createElement('tr');
      row.dataset.hash = key.hash;
      const name = element('td', null, 'name');
      name.append(element('span', key.name, 'key-name'));
      // Its first and last characters, to tell keys of one name apart.
      if (key.hint) name.append(element('span', key.hint, 'hint help'));
      // What it may call, and how often, when it has its own bounds.
      if (key.allowed_models) name.append(items('Models:', key.allowed_models, ',', 'models help'));
      if (key.rate_limit) {
        name.append(items(null, [key.rate_limit.requests + ' requests', 'per ' + key.rate_limit.window_seconds + ' s'],
          '', 'rate help'));
      }
      row.append(name);
      const accountCell = element('td', key.account, 'operator-only');
      accountCell.hidden = !session.operator;
      row.append(accountCell);
      // Made, last used, expires: a line each, in one column.
      const dates = element('td', null, 'dates');
      const dateLine = (words, className, timestamp, whole) => {
        const line = element('span', null, 'line');
        const value = element('span', timestamp ? null : 'never', className);
        if (timestamp) value.append(whole ? element('span', day(timestamp), 'day') : moment(timestamp));
        if (timestamp) value.title = timestamp;
        line.append(element('span', words, 'help'), ' ', value);
        dates.append(line);
      };
      dateLine('made', 'created', key.created_at, true);
      dateLine('used', 'last-used', key.last_used_at, false);
      dateLine('expires', 'expires', key.expires_at, false);
      row.append(dates);

      const limit = element('td', null, 'limit');
      if (key.limit === null) {
        limit.textContent = 'No limit';
      } else {
        const used = limitUsed(key);
        const period = PERIOD_WORDS[key.limit_reset] || 'in all';
        limit.append(element('span', credits(key.limit) + ' ' + (RESETS[key.limit_reset] || 'in all')));
        const bar = document.createElement('progress');
        bar.max = key.limit > 0 ? key.limit : 1;
        bar.value = Math.min(used, bar.max);
        bar.setAttribute('aria-label', credits(used) + ' of ' + credits(key.limit) + ' credits used ' + period);
        if (key.limit_remaining === 0) bar.className = 'full';
        limit.append(bar);
        limit.append(element('span', credits(key.limit_remaining) + ' left ' + period, 'help'));
      }
      row.append(limit);
      // The three periods in one column, each named.
      const usage = element('td', null, 'usage');
      for (const [words, value, className] of [
        ['day', key.usage_daily, 'usage-daily'],
        ['week', key.usage_weekly, 'usage-weekly'],
        ['month', key.usage_monthly, 'usage-monthly'],
      ]) {
        const line = element('span', null, 'period');
        line.append(element('span', credits(value), 'num ' + className), ' ', element('span', words, 'help'));
        usage.append(line);
      }
      row.append(usage);
      const status = element('td', null, 'status');
      const state = keyStatus(key);
      status.append(element('span', state, 'badge ' + state));
      if (key.management) status.append(element('span', 'management', 'badge management'));
      if (key.current) status.append(element('span', 'in use', 'badge current'));
      // Replaced, still working for its grace.
      if (key.rotated_to && state === 'active') status.append(element('span', 'replaced', 'badge rotating'));
      row.append(status);
      const actions = element('td', null, 'key-actions');
      actions.append(button('Edit', 'secondary', 'Edit key ' + key.name, () => openEditor(key.hash)));
      // A new key in its place; this one works for an hour more. Not for a
      // key that is off or was rotated already, nor for a management key
      // unless the operator is signed in (the API answers 403
      // operator_only). Asked first (confirmRotation).
      if (keyStatus(key) === 'active' && !key.rotated_to && !key.operator &&
          (!key.management || session.operator)) {
        actions.append(button('Rotate', 'secondary', 'Rotate key ' + key.name, () => {
          say('');
          confirmRotation(key.hash);
        }));
      }
      row.append(actions);
      return row;
    });
    $('key-rows').replaceChildren(...rows);
    labelCells($('key-table'));
    $('no-keys').hidden = keys.length > 0;
    if (rotating && !keys.some((key) => key.hash === rotating)) closeRotation();
    $('key-caption').textContent = (session.operator && session.account === null
      ? 'Every key'
      : 'The keys of ' + (session.account ? 'the account ' + session.account : 'this account')) +
      ', with their last use (to within a minute, in UTC) and their usage in the current UTC day, week (from Monday) and month, in credits.';
    const note = $('create-key-account');
    note.hidden = !session.operator;
    note.textContent = session.account === null
      ? 'New keys go to the default account; choose an account below to create keys for it.'
      : 'New keys go to the account ' + session.account + '.';
    if (editing) {
      const current = keys.find((key) => key.hash === editing);
      if (current) fillEditor(current); else closeEditor();
    }
    renderLeaks();
    // The generations name their keys from this list.
    renderGenerations();
  }

  // The notice above the table: each leaked key, when and by whom it was
  // reported, where it was found, and the way out (a replacement, then
  // deletion). Drawn anew only when that changes: a screen reader reads
  // an alert again each time its content is replaced.
  function renderLeaks() {
    const leaked = keys.filter((key) => key.leak);
    const signature = JSON.stringify([session.account, leaked.map((key) => [key.hash, key.name, key.leak])]);
    if (signature === shownLeaks) return;
    shownLeaks = signature;
    const items = leaked.map((key) => {
      const { reported_at: reportedAt, reported_by: reportedBy, url, source } = key.leak;
      const item = element('li');
      item.dataset.hash = key.hash;
      const what = element('p');
      what.append(element('strong', key.name));
      if (session.operator && session.account === null) what.append(' (account ' + key.account + ')');
      what.append(' was reported leaked on ', moment(reportedAt), ' by ' + (REPORTERS[reportedBy] || reportedBy) + '.');
      item.append(what);
      if (url || source) {
        const where = element('p', 'Found');
        if (source) where.append(' in ' + source);
        if (url) where.append(' at ', webLink(url));
        item.append(where);
      }
      const actions = element('div', null, 'actions');
      actions.append(
        button('Create a replacement', null, 'Create a replacement for key ' + key.name, () => {
          say('');
          attempt(() => prepareReplacement(key.hash));
        }),
        button('Delete', 'danger', 'Delete key ' + key.name, () => {
          say('');
          openEditor(key.hash);
          confirmDeletion();
        }),
      );
      item.append(actions);
      return item;
    });
    $('leak-list').replaceChildren(...items);
    $('leaks').hidden = items.length === 0;
  }

  async function loadAccounts() {
    let accounts;
    try {
      accounts = await allPages('/api/v1/accounts');
    } catch (error) {
      if (missingRoute(error)) {
        $('accounts').hidden = true;
        return;
      }
      throw error;
    }
    const rows = accounts.map((account) => {
      const row = document.createElement('tr');
      row.dataset.account = account.id;
      if (account.id === session.account) row.className = 'selected';
      row.append(element('td', account.id, 'account-id'));
      row.append(element('td', account.name || '–'));
      row.append(element('td', account.email || '–'));
      row.append(element('td', credits(account.balance), 'num balance'));

      const topUp = element('td');
      const form = element('form', null, 'inline');
      const amount = document.createElement('input');
      amount.type = 'number';
      amount.min = '0';
      amount.step = 'any';
      amount.required = true;
      amount.className = 'amount';
      amount.setAttribute('aria-label', 'Credits to add to ' + account.id);
      const add = element('button', 'Top up');
      add.type = 'submit';
      form.append(amount, add);
      form.addEventListener('submit', (event) => {
        event.preventDefault();
        attempt(async () => {
          const value = Number(amount.value);
          if (!(value > 0)) throw new Error('Enter the credits to add, more than zero.');
          const result = (await api('POST', '/api/v1/accounts/' + encodeURIComponent(account.id) + '/credits', {
            body: { amount: value },
            headers: { 'Idempotency-Key': idempotencyKey() },
          })).data;
          sayDone('Added ' + credits(value) + ' credits to ' + account.id + ': the balance is ' + credits(result.balance) + '.');
          await refresh();
        });
      });
      topUp.append(form);
      row.append(topUp);

      const actions = element('td');
      const choose = element('button', account.id === session.account ? 'Shown' : 'Show keys', 'secondary');
      choose.type = 'button';
      choose.disabled = account.id === session.account;
      choose.setAttribute('aria-label', 'Show the keys of ' + account.id);
      choose.addEventListener('click', () => attempt(async () => {
        session.account = account.id;
        generationsOffset = 0;
        closeEditor();
        await refresh();
      }));
      actions.append(choose);
      row.append(actions);
      return row;
    });
    $('account-rows').replaceChildren(...rows);
    labelCells($('account-table'));
  }

  // ---- usage: recent generations and the account's apps -------------

  const RECENT_GENERATIONS = 20;
  const PERIODS = { day: 'today', week: 'this week', month: 'this month' };

  // The usage sections show the account shown above them. For a key
  // scoped to an account that is its own account. The operator's key
  // manages every account, and the API wants it to name one: the
  // sections follow the account chosen in the Accounts table
  // ("default" until another is chosen), so switching
  // accounts switches them too. `account` is always named, even for a
  // scoped key: without it the operator's key gets the whole gateway's
  // app ranking.
  // With no account known (a gateway too old to say) or no usage routes
  // (older still), the sections stay hidden.
  async function loadUsage() {
    await Promise.all([loadActivity(), loadGenerations(), loadApps()]);
  }

  function hideUsage() {
    $('activity').hidden = true;
    $('generations').hidden = true;
    $('apps').hidden = true;
  }

  // GET with ?account= of the account shown; null when the sections are
  // hidden instead (see loadUsage), or when a later load overtook this
  // one (`current` says whether it is still the latest).
  async function usage(path, current) {
    const account = session.account;
    if (account === null) {
      hideUsage();
      return null;
    }
    const joiner = path.includes('?') ? '&' : '?';
    let answer;
    try {
      answer = await api('GET', path + joiner + 'account=' + encodeURIComponent(account));
    } catch (error) {
      if (!current()) return null;
      if (missingRoute(error)) {
        hideUsage();
        return null;
      }
      throw error;
    }
    return current() ? { account, data: answer.data, nextOffset: answer.next_offset } : null;
  }

  async function loadGenerations(offset) {
    if (typeof offset === 'number') generationsOffset = offset;
    const load = ++generationsLoad;
    const path = '/api/v1/generations?limit=' + RECENT_GENERATIONS + '&offset=' + generationsOffset;
    const answer = await usage(path, () => load === generationsLoad);
    if (!answer) return;
    generations = Array.isArray(answer.data) ? answer.data : [];
    generationsNext = typeof answer.nextOffset === 'number' ? answer.nextOffset : null;
    const first = generationsOffset + 1;
    $('generation-caption').textContent = 'Requests of the account ' + answer.account +
      (generations.length ? ', ' + first + ' to ' + (generationsOffset + generations.length) : '') +
      ' counting from the newest, the newest first, with their cost in credits.';
    $('generations-newer').disabled = generationsOffset === 0;
    $('generations-older').disabled = generationsNext === null;
    renderGenerations();
    $('generations').hidden = false;
  }

  // The account's spend per UTC day and model: a chart (activity.js)
  // and a table of the same figures. A gateway without the route (an
  // older one) leaves the other usage sections as they are.
  const ACTIVITY_DAYS = 30;
  async function loadActivity() {
    const load = ++activityLoad;
    const account = session.account;
    if (account === null) {
      $('activity').hidden = true;
      return;
    }
    let answer;
    try {
      answer = await api('GET', '/api/v1/activity?account=' + encodeURIComponent(account));
    } catch (error) {
      if (load !== activityLoad) return;
      if (missingRoute(error)) {
        $('activity').hidden = true;
        return;
      }
      throw error;
    }
    if (load !== activityLoad) return;
    renderActivity(Array.isArray(answer.data) ? answer.data : [], account);
    $('activity').hidden = false;
  }

  function renderActivity(rows, account) {
    // The window as this browser's clock sees it, widened to any day the
    // gateway answered (its clock decides).
    const today = new Date();
    const start = new Date(today);
    start.setUTCDate(start.getUTCDate() - ACTIVITY_DAYS);
    let first = start.toISOString().slice(0, 10);
    let last = today.toISOString().slice(0, 10);
    for (const row of rows) {
      if (row.date < first) first = row.date;
      if (row.date > last) last = row.date;
    }
    // The chart's models, each its colour: those that spent credits.
    const models = Array.from(new Set(rows.filter((row) => Number(row.usage) > 0).map((row) => row.model))).sort();
    const chart = globalThis.modelgateActivity;
    chart.draw($('activity-chart'), rows, models, first, last, credits);
    chart.legend($('activity-legend'), models);
    const held = rows.reduce((sum, row) => sum + (Number(row.hold_charged_requests) || 0), 0);
    $('activity-caption').textContent = 'Credits the account ' + account + ' spent per UTC day from ' + first +
      ' to ' + last + ', by model (BYOK requests are in the table only).' +
      (held > 0 ? ' ' + counted(held, 'request') + ' were charged their whole hold, their usage never known ' +
        '(lapsed or unanswered): the table says which.' : '');
    const body = rows.map((row) => {
      const line = document.createElement('tr');
      line.dataset.date = row.date;
      line.dataset.model = row.model;
      line.append(element('td', row.date, 'date'));
      const model = element('td', null, 'model');
      model.append(element('span', row.model === 'unknown' ? 'unknown (lapsed requests)' : row.model, 'model-name'));
      // Charged holds counted in the row: said in words beside it.
      const held = Number(row.hold_charged_requests) || 0;
      if (held > 0) {
        model.append(element('span', counted(held, 'request') + ' charged whole holds (' +
          credits(row.hold_charged_usage) + ' credits): usage never known', 'help held'));
      }
      line.append(model);
      line.append(element('td', count(row.requests), 'num requests'));
      line.append(element('td', count(row.prompt_tokens), 'num tokens-in'));
      line.append(element('td', count(row.cached_tokens), 'num tokens-cached'));
      line.append(element('td', count(row.completion_tokens), 'num tokens-out'));
      line.append(element('td', count(row.reasoning_tokens), 'num tokens-reasoning'));
      line.append(element('td', credits(row.usage), 'num usage'));
      line.append(element('td', credits(row.byok_usage_inference), 'num byok'));
      return line;
    });
    $('activity-rows').replaceChildren(...body);
    labelCells($('activity-table'));
    $('no-activity').hidden = body.length > 0;
  }

  // The account's newest records (up to CSV_PAGES pages of 100) as one CSV
  // file, fetched with the key (a link cannot carry it) and saved.
  const CSV_PAGES = 10;
  async function downloadCsv() {
    const account = session.account;
    if (account === null) return;
    const parts = [];
    for (let page = 0; page < CSV_PAGES; page += 1) {
      const path = '/api/v1/generations?format=csv&limit=100&offset=' + page * 100 +
        '&account=' + encodeURIComponent(account);
      const response = await fetch(path, {
        headers: { Authorization: 'Bearer ' + session.key },
        cache: 'no-store',
        credentials: 'omit',
        referrerPolicy: 'no-referrer',
      });
      if (!response.ok) throw new ApiError(response.status, 'The export failed: the gateway answered ' + response.status + '.');
      // No field holds a line break (the gateway refuses them in what it
      // records), so a record is a line.
      const lines = (await response.text()).split('\r\n').filter((line) => line !== '');
      // Each page repeats the header; the file has it once.
      parts.push(...(page === 0 ? lines : lines.slice(1)));
      if (lines.length - 1 < 100) break;
    }
    const file = new Blob([parts.join('\r\n') + '\r\n'], { type: 'text/csv' });
    const link = document.createElement('a');
    link.href = URL.createObjectURL(file);
    link.download = 'generations-' + account + '.csv';
    link.id = 'generations-csv-file';
    link.hidden = true;
    document.body.append(link);
    link.click();
    // Kept a moment for the browser to start the download.
    setTimeout(() => {
      URL.revokeObjectURL(link.href);
      link.remove();
    }, 60000);
    sayDone('Downloaded ' + (parts.length - 1) + ' generations as CSV.');
  }

  // The key that made a request, by its name in the key list; a key not
  // in it (deleted since) by the start of its hash.
  function keyCell(hash, names) {
    const cell = element('td', null, 'key');
    if (typeof hash !== 'string' || hash === '') {
      cell.textContent = '–';
    } else if (names.has(hash)) {
      cell.textContent = names.get(hash);
    } else {
      cell.append(element('code', hash.slice(0, 12) + '…'));
      cell.title = 'Key ' + hash + ' (no longer listed)';
    }
    return cell;
  }

  // Model names and app titles come from clients and upstreams: text only.
  function renderGenerations() {
    const names = new Map(keys.map((key) => [key.hash, key.name]));
    const rows = generations.map((record) => {
      const row = document.createElement('tr');
      row.dataset.id = record.id;
      const time = element('td', record.created_at ? null : '–', 'time');
      if (record.created_at) time.append(moment(record.created_at, true));
      row.append(time);
      row.append(keyCell(record.key_hash, names));
      const model = element('td', null, 'model');
      model.append(element('span', record.model || (chargedHold(record) ? 'not recorded' : '–')));
      if (record.requested_model && record.requested_model !== record.model) {
        model.append(element('span', 'asked for ' + record.requested_model, 'help requested'));
      }
      row.append(model);
      row.append(element('td', API_NAMES[record.api] || '–', 'api'));
      row.append(element('td', count(record.tokens_prompt), 'num tokens-in'));
      row.append(element('td', count(record.native_tokens_cached), 'num tokens-cached'));
      row.append(element('td', count(record.tokens_completion), 'num tokens-out'));
      row.append(element('td', count(record.native_tokens_reasoning), 'num tokens-reasoning'));
      const cost = element('td', credits(record.total_cost), 'num cost');
      const note = COST_NOTES[record.cost_basis] || (chargedHold(record) ? COST_NOTES.lapsed : null);
      if (note) cost.title = note;
      row.append(cost);
      row.append(element('td', record.status === null || record.status === undefined ? '–' : String(record.status), 'status'));
      const app = element('td', record.app_title || record.app_id || '–', 'app');
      if (typeof record.origin === 'string') app.title = record.origin;
      row.append(app);
      const marks = element('td', null, 'marks');
      if (record.streamed) marks.append(element('span', 'streamed', 'badge streamed'));
      if (record.cancelled) marks.append(element('span', 'cancelled', 'badge cancelled'));
      if (record.is_byok) marks.append(element('span', 'BYOK', 'badge byok'));
      if (note) {
        const basis = COST_MARKS[record.cost_basis] || 'lapsed';
        marks.append(element('span', basis, 'badge charged ' + basis.replace(' ', '-')));
        marks.append(element('span', note, 'help note'));
      }
      row.append(marks);
      return row;
    });
    $('generation-rows').replaceChildren(...rows);
    labelCells($('generation-table'));
    $('no-generations').hidden = rows.length > 0;
  }

  async function loadApps() {
    const load = ++appsLoad;
    const period = $('apps-period').value;
    const answer = await usage('/api/v1/apps?period=' + encodeURIComponent(period), () => load === appsLoad);
    if (!answer) return;
    renderApps(answer.data, answer.account);
    $('apps').hidden = false;
  }

  function renderApps(ranking, account) {
    const apps = ranking && Array.isArray(ranking.apps) ? ranking.apps : [];
    const period = PERIODS[ranking && ranking.period] || 'this period';
    const since = ranking && ranking.starts_at ? ' (UTC, since ' + day(ranking.starts_at) + ')' : '';
    $('app-caption').textContent = 'The apps of the account ' + account + ' ' + period + since +
      ', ranked by tokens.';
    const rows = apps.map((app) => {
      const row = document.createElement('tr');
      row.dataset.app = app.id;
      row.append(element('td', count(app.rank), 'num rank'));
      const name = element('td', null, 'app');
      name.append(element('span', app.title || app.id || '–', 'title'));
      if (app.url) name.append(webLink(app.url));
      row.append(name);
      row.append(element('td', count(app.requests), 'num requests'));
      row.append(element('td', count(app.tokens), 'num tokens'));
      const models = element('td', null, 'models');
      const list = element('ul', null, 'models');
      for (const model of Array.isArray(app.models) ? app.models : []) {
        list.append(element('li', (model.model || '–') + ': ' + counted(model.requests, 'request') + ', ' +
          counted(model.tokens, 'token')));
      }
      models.append(list);
      row.append(models);
      return row;
    });
    $('app-rows').replaceChildren(...rows);
    labelCells($('app-table'));
    $('no-apps').hidden = rows.length > 0;
  }

  // ---- editing a key ------------------------------------------------

  // An instant as a datetime-local field shows it: UTC, to the minute.
  const localInput = utcInput;

  function fillEditor(key) {
    $('edit-key-title').textContent = 'Edit key “' + key.name + '”';
    $('edit-name').value = key.name;
    $('edit-limit').value = key.limit === null ? '' : String(key.limit);
    $('edit-reset').value = key.limit_reset || '';
    $('edit-byok').checked = Boolean(key.include_byok_in_limit);
    $('edit-expires').value = key.expires_at ? localInput(key.expires_at) : '';
    $('edit-models').value = (key.allowed_models || []).join(', ');
    $('edit-rate-requests').value = key.rate_limit ? String(key.rate_limit.requests) : '';
    $('edit-rate-window').value = key.rate_limit ? String(key.rate_limit.window_seconds) : '';
    // A management key calls no models: neither applies to it.
    for (const id of ['edit-models', 'edit-rate-requests', 'edit-rate-window']) {
      $(id).disabled = Boolean(key.management);
    }
    // A rotated key stops when its grace ends; the key in use keeps its
    // expiry (it must not lock itself out); a management key's is the
    // operator's to set.
    $('edit-expires').disabled = Boolean(key.rotated_to) || key.current === true ||
      (key.management && !session.operator);
    const disabled = $('edit-disabled');
    disabled.checked = Boolean(key.disabled);
    // A leaked key cannot be enabled again (the API answers 422): the
    // switch is not offered, and the note says why.
    const leaked = Boolean(key.leak);
    // Nor can the key in use disable or delete itself (409 own_key).
    const current = key.current === true;
    disabled.disabled = leaked || current;
    $('edit-disabled-note').hidden = !leaked;
    const note = $('edit-current-note');
    note.hidden = !current;
    note.textContent = current ? (session.operator ? OWN_OPERATOR_KEY : OWN_KEY) : '';
    $('delete-key').disabled = current;
    const describe = (control, noteId) => {
      if (noteId) control.setAttribute('aria-describedby', noteId);
      else control.removeAttribute('aria-describedby');
    };
    describe(disabled, leaked ? 'edit-disabled-note' : current ? 'edit-current-note' : null);
    describe($('delete-key'), current ? 'edit-current-note' : null);
  }

  function openEditor(hash) {
    const key = keys.find((candidate) => candidate.hash === hash);
    if (!key) return;
    editing = hash;
    fillEditor(key);
    $('confirm-delete').hidden = true;
    $('edit-key').hidden = false;
    $('edit-key-title').focus();
  }

  function closeEditor() {
    editing = null;
    $('edit-key').hidden = true;
    $('confirm-delete').hidden = true;
  }

  async function saveKey() {
    const key = keys.find((candidate) => candidate.hash === editing);
    if (!key) return;
    const update = {
      name: $('edit-name').value.trim(),
      limit: limitField($('edit-limit')),
      limit_reset: $('edit-reset').value || null,
      include_byok_in_limit: $('edit-byok').checked,
    };
    // Sent only when changed: an expiry shown to the minute, saved again
    // unchanged, would move it to that minute.
    const expires = expiresField($('edit-expires'));
    const shown = key.expires_at ? localInput(key.expires_at) : '';
    if (!$('edit-expires').disabled && $('edit-expires').value !== shown) update.expires_at = expires;
    if (!key.management) {
      update.allowed_models = modelsField($('edit-models'));
      update.rate_limit = rateField($('edit-rate-requests'), $('edit-rate-window'));
    }
    // A leaked key and the key in use keep their state (see fillEditor).
    if (!key.leak && !key.current) update.disabled = $('edit-disabled').checked;
    if (!update.name) throw new Error('Name must not be empty.');
    const saved = (await api('PATCH', '/api/v1/keys/' + key.hash, { body: update })).data;
    sayDone('Saved the key “' + saved.name + '”' +
      (saved.limit === null ? ': no limit.' : ': limit ' + credits(saved.limit) + ' credits.'));
    await loadKeys();
  }

  // The in-page confirmation every deletion goes through.
  function confirmDeletion() {
    if (!editing) return;
    const key = keys.find((candidate) => candidate.hash === editing);
    if (key && key.current) return;
    $('confirm-delete').hidden = false;
    $('confirm-delete-no').focus();
  }

  async function deleteKey() {
    const key = keys.find((candidate) => candidate.hash === editing);
    if (!key) return;
    await api('DELETE', '/api/v1/keys/' + key.hash);
    closeEditor();
    sayDone('Deleted the key “' + key.name + '”: requests with it are refused.');
    await loadKeys();
  }

  // ---- creating ------------------------------------------------------

  async function createKey() {
    const body = { name: $('new-name').value.trim() };
    if (!body.name) throw new Error('Name is required.');
    const limit = limitField($('new-limit'));
    if (limit !== null) body.limit = limit;
    if ($('new-reset').value) body.limit_reset = $('new-reset').value;
    const expires = expiresField($('new-expires'));
    if (expires !== null) body.expires_at = expires;
    if ($('new-byok').checked) body.include_byok_in_limit = true;
    const models = modelsField($('new-models'));
    if (models !== null) body.allowed_models = models;
    const rate = rateField($('new-rate-requests'), $('new-rate-window'));
    if (rate !== null) body.rate_limit = rate;
    // Only the operator names the account, or asks for a management key.
    if (session.operator && session.account !== null) body.account = session.account;
    if (session.operator && $('new-management').checked) body.management = true;
    const created = await api('POST', '/api/v1/keys', { body });
    $('create-key-form').reset();
    $('new-key-value').value = created.key;
    $('new-key').hidden = false;
    $('new-key-title').focus();
    sayDone('Created the key “' + created.data.name + '”. Copy it now: it is not shown again.');
    await loadKeys();
  }

  // Rotate asks first, saying what becomes of the key and of whoever
  // uses it. The key this page is signed in with is never offered one: it
  // is a management key, which only the operator rotates, or the
  // operator's own, which is not rotated.
  function confirmRotation(hash) {
    const key = keys.find((candidate) => candidate.hash === hash);
    if (!key) return;
    rotating = hash;
    $('confirm-rotate-text').textContent = 'Rotate the key “' + key.name + '”? A new key with the same settings ' +
      'is made and shown once. This key keeps working for an hour, then is refused: put the new key ' +
      'wherever this one is used before then.';
    $('confirm-rotate').hidden = false;
    $('confirm-rotate-no').focus();
  }

  function closeRotation() {
    rotating = null;
    $('confirm-rotate').hidden = true;
  }

  async function rotateKey() {
    const key = keys.find((candidate) => candidate.hash === rotating);
    closeRotation();
    if (!key) return;
    const rotated = await api('POST', '/api/v1/keys/' + key.hash + '/rotate');
    $('new-key-value').value = rotated.key;
    $('new-key').hidden = false;
    $('new-key-title').focus();
    const until = utcText(rotated.rotated.expires_at);
    sayDone('Rotated the key “' + key.name + '”. Copy the new key now: it is not shown again. ' +
      'The old key works until ' + until + '.');
    await loadKeys();
  }

  // "Create a replacement" for a leaked key: the create form filled in
  // with its name, limit and settings, so creating it shows the new key
  // once as always; the person then swaps it in and deletes the old one.
  async function prepareReplacement(hash) {
    const key = keys.find((candidate) => candidate.hash === hash);
    if (!key) return;
    if (session.operator && session.account !== key.account) {
      // New keys go to the account shown: show the leaked key's.
      session.account = key.account;
      generationsOffset = 0;
      closeEditor();
      await refresh();
    }
    $('create-key-form').reset();
    $('new-name').value = key.name;
    $('new-limit').value = key.limit === null ? '' : String(key.limit);
    $('new-reset').value = key.limit_reset || '';
    $('new-byok').checked = Boolean(key.include_byok_in_limit);
    $('new-models').value = (key.allowed_models || []).join(', ');
    $('new-rate-requests').value = key.rate_limit ? String(key.rate_limit.requests) : '';
    $('new-rate-window').value = key.rate_limit ? String(key.rate_limit.window_seconds) : '';
    if (session.operator) $('new-management').checked = Boolean(key.management);
    $('new-name').focus();
    say('The form below has the settings of the leaked key “' + key.name +
      '”: create the replacement, put it where the leaked key was used, then delete the leaked key.');
  }

  async function copyKey() {
    const field = $('new-key-value');
    try {
      // Only in a secure context (https, or localhost).
      await navigator.clipboard.writeText(field.value);
    } catch (_) {
      field.select();
      if (!document.execCommand('copy')) throw new Error('Copying is not allowed here: select the key and copy it by hand.');
    }
    sayDone('The key is copied.');
  }

  async function createAccount() {
    const body = { id: $('account-id').value.trim() };
    const name = $('account-name').value.trim();
    if (name) body.name = name;
    const email = $('account-email').value.trim();
    if (email) body.email = email;
    const created = (await api('POST', '/api/v1/accounts', { body })).data;
    $('create-account-form').reset();
    $('create-account').open = false;
    sayDone('Created the account ' + created.id + '.');
    await loadAccounts();
  }

  // ---- wiring ---------------------------------------------------------

  function onSubmit(id, action) {
    $(id).addEventListener('submit', (event) => {
      event.preventDefault();
      say('');
      attempt(action);
    });
  }
  function onClick(id, action) {
    $(id).addEventListener('click', () => {
      say('');
      attempt(action);
    });
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('sign-in-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const key = $('management-key').value.trim();
      say('Signing in…');
      signIn(key).then(
        () => {
          say('');
          attempt(refresh);
        },
        (error) => {
          signOut();
          sayError('Sign-in failed: ' + error.message);
        },
      );
    });
    onClick('sign-out', async () => {
      signOut();
      sayDone('Signed out. The key is forgotten in this tab.');
    });
    onClick('refresh', refresh);
    onClick('refresh-usage', loadUsage);
    onClick('generations-newer', () => loadGenerations(Math.max(0, generationsOffset - RECENT_GENERATIONS)));
    onClick('generations-older', () => loadGenerations(generationsNext === null ? generationsOffset : generationsNext));
    onClick('generations-csv', downloadCsv);
    $('apps-period').addEventListener('change', () => {
      say('');
      attempt(loadApps);
    });
    onSubmit('create-key-form', createKey);
    onSubmit('edit-key-form', saveKey);
    onClick('edit-cancel', async () => closeEditor());
    onClick('delete-key', async () => confirmDeletion());
    onClick('confirm-delete-no', async () => {
      $('confirm-delete').hidden = true;
    });
    onClick('confirm-delete-yes', deleteKey);
    onClick('confirm-rotate-no', async () => closeRotation());
    onClick('confirm-rotate-yes', rotateKey);
    onClick('copy-key', copyKey);
    onClick('new-key-done', async () => {
      $('new-key-value').value = '';
      $('new-key').hidden = true;
    });
    onSubmit('create-account-form', createAccount);

    // Still signed in from before a reload of this tab.
    const stored = sessionStorage.getItem(STORAGE_KEY);
    if (stored) {
      signIn(stored).then(
        () => attempt(refresh),
        (error) => {
          signOut();
          sayError('Sign in again: ' + error.message);
        },
      );
    } else {
      $('management-key').focus();
    }
  });
})();
