// Browser test of the UI's token prompt against a tokenwatch with auth.tokens_file: the page (open)
// asks once for a token, a refused token is dropped and asked again, an accepted one is kept for
// the tab's session (a reload asks nothing) and sent on every API call; a stored token of the
// wrong role (403) is dropped and asked again too.
//
//   node ui/tests/auth.mjs http://127.0.0.1:9464 READ_TOKEN UNKNOWN_TOKEN INGEST_TOKEN
//
// Uses the system Chromium (Debian `chromium`, /usr/bin/chromium; CHROMIUM overrides the path).

import { chromium } from 'playwright-core';

const [base, readToken, wrongToken, otherRoleToken] = process.argv.slice(2);
if (!base || !readToken || !wrongToken || !otherRoleToken) {
  console.error('usage: node ui/tests/auth.mjs BASE_URL READ_TOKEN UNKNOWN_TOKEN INGEST_TOKEN');
  process.exit(2);
}
const TIMEOUT = 20_000;

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const result = {};
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  const apiCalls = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname.startsWith('/api/')) apiCalls.push(r.headers().authorization ?? '');
  });
  const forms = () => page.locator('#auth-form').count();

  await page.goto(base);
  await page.waitForSelector('#auth-form', { timeout: TIMEOUT });
  // Several calls got a 401 at once: still one form.
  await page.waitForTimeout(2500);
  check((await forms()) === 1, `expected one token form, found ${await forms()}`);
  check((await page.getAttribute('body', 'data-ready')) === '0', 'the page showed data without a token');

  await page.fill('#auth-token', wrongToken);
  await page.click('#auth-form button');
  await page.waitForSelector('#auth-form >> text=That token was refused', { timeout: TIMEOUT });
  check((await forms()) === 1, 'a refused token must bring back one form');
  check((await page.evaluate(() => sessionStorage.getItem('tokenwatch.token'))) === null, 'the refused token was kept');

  await page.fill('#auth-token', readToken);
  await page.click('#auth-form button');
  await page.waitForSelector('body[data-ready="1"]', { timeout: TIMEOUT });
  check((await forms()) === 0, 'the form stayed after a good token');
  check((await page.evaluate(() => sessionStorage.getItem('tokenwatch.token'))) === readToken, 'the token is not in sessionStorage');

  // A reload in the same tab keeps the token: no form, data again, every API call authorised.
  apiCalls.length = 0;
  await page.reload();
  await page.waitForSelector('body[data-ready="1"]', { timeout: TIMEOUT });
  await page.waitForTimeout(2500);
  check((await forms()) === 0, 'a reload asked for the token again');
  check(apiCalls.length > 0 && apiCalls.every((a) => a === `Bearer ${readToken}`), `API calls without the token: ${JSON.stringify(apiCalls)}`);
  result.calls_after_reload = apiCalls.length;

  // A stored token that does not allow reading (here an ingest token) is dropped and asked again.
  await page.evaluate((t) => sessionStorage.setItem('tokenwatch.token', t), otherRoleToken);
  await page.reload();
  await page.waitForSelector('#auth-form >> text=That token was refused', { timeout: TIMEOUT });
  check((await page.evaluate(() => sessionStorage.getItem('tokenwatch.token'))) === null, 'the stale token was kept');
  check(errors.length === 0, `page errors: ${errors.join('; ')}`);
  result.ok = true;
} catch (e) {
  result.ok = false;
  result.error = e.message;
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
process.exit(result.ok ? 0 : 1);
