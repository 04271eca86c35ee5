// Runs the status page's own script, as a browser would, against a live admin server:
// node tests/status_page_run.mjs http://host:port
// The page is fetched over HTTP; its script runs with a stand-in `document` (each element
// a record of what the script wrote into it) and `fetch` resolved against the server.
// After its first refresh, prints {element id: text or HTML written} as JSON and exits.
import {setTimeout as sleep} from "node:timers/promises";

const base = process.argv[2];
const html = await (await fetch(base + "/")).text();
const script = html.split("<script>")[1].split("</script>")[0];
const elements = {};
let refreshed = null;
const done = new Promise(resolve => { refreshed = resolve; });
const realFetch = globalThis.fetch;
globalThis.document = {getElementById: id => (elements[id] ??= {innerHTML: "", textContent: ""})};
globalThis.fetch = (url, options) => realFetch(base + url, options);
globalThis.setTimeout = () => refreshed();  // the page schedules its next refresh: stop
new Function(script)();
await Promise.race([done, sleep(20000)]);
const written = Object.fromEntries(Object.entries(elements).map(
  ([id, e]) => [id, String(e.innerHTML || e.textContent)]));
console.log(JSON.stringify(written));
