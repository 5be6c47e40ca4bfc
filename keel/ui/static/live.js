// Keel UI, a session page kept live: the record, the gauge and the event stream, relayed
// by the server as server-sent events. No framework, nothing fetched but this origin.
(function () {
  "use strict";
  var me = document.currentScript;
  var session = me.dataset.session;
  var follow = me.dataset.follow === "1";
  var afterSeq = parseInt(me.dataset.afterSeq || "0", 10);
  var afterEvent = 0;
  var base = "/sessions/" + encodeURIComponent(session);
  var record = document.getElementById("record");
  var streaming = document.getElementById("streaming");
  var events = document.getElementById("events");
  var state = document.getElementById("live-state");
  var recall = document.getElementById("recall");
  var fmt = function (n) { return Number(n).toLocaleString("en-US"); };

  function text(tag, value, cls) {
    var el = document.createElement(tag);
    el.textContent = value;
    if (cls) { el.className = cls; }
    return el;
  }
  function log(line) {
    events.insertBefore(text("li", line), events.firstChild);
    while (events.children.length > 200) { events.removeChild(events.lastChild); }
  }
  function onRecord(data) {
    var tpl = document.createElement("template");
    tpl.innerHTML = data.html;  // server-rendered, escaped by the template
    Array.prototype.slice.call(tpl.content.children).forEach(function (el) {
      if (!el.id || !document.getElementById(el.id)) { record.appendChild(el); }
    });
    afterSeq = Math.max(afterSeq, data.last_seq);
    // The header's figures follow the rows read live (they were the page load's); a
    // message shown folds its tool rows, so the count is the relay's, not the page's.
    var count = document.getElementById("record-count");
    if (count && data.rows) {
      count.dataset.count = String(Number(count.dataset.count) + data.rows);
      count.textContent = fmt(Number(count.dataset.count));
    }
    ["record-shown-to", "record-last-seq"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el && Number(el.textContent) < afterSeq) { el.textContent = String(afterSeq); }
    });
    var empty = record.querySelector(".empty");
    if (empty) { empty.remove(); }
    if (data.html.indexOf("msg-assistant") >= 0) { streaming.hidden = true; }
    // A new row may be an approval's wait or decision line: the buttons follow the record
    // even when the session has no event stream.
    if (data.html.indexOf("msg-harness") >= 0) { refreshApprovals(); }
  }
  function onStatus(s) {
    var set = function (id, v) { var el = document.getElementById(id); if (el) { el.textContent = v; } };
    set("phase", s.phase); set("turn", s.turn); set("checkpoint-count", s.checkpoint_count);
    set("gauge-text", fmt(s.context_tokens) + " tokens now");
    set("gauge-threshold", fmt(s.checkpoint_threshold)); set("gauge-window", fmt(s.context_window));
    var fill = document.getElementById("gauge-fill");
    if (fill) { fill.style.width = Math.min(100, 100 * s.context_tokens / Math.max(1, s.context_window)).toFixed(1) + "%"; }
    // A sub-agent's wait on a person is on its own stream, not this one: while one works,
    // the approvals box is read again with each status.
    if ((s.children || []).some(function (c) { return c.done == null; })) { refreshApprovals(); }
  }
  function refreshApprovals() {
    fetch(base + "/approvals", {credentials: "same-origin"}).then(function (r) { return r.text(); })
      .then(function (html) {
        var tpl = document.createElement("template");
        tpl.innerHTML = html;
        var fresh = tpl.content.getElementById("approvals");
        var old = document.getElementById("approvals");
        // Unchanged, or the person is typing in it (a denial's note): left as it is.
        if (!fresh || !old || fresh.innerHTML === old.innerHTML || old.contains(document.activeElement)) { return; }
        old.replaceWith(fresh);
      });
  }
  function onEvent(e) {
    afterEvent = Math.max(afterEvent, e.offset + 1);
    var turn = e.turn != null ? "turn " + e.turn + ": " : "";
    switch (e.type) {
      case "text_delta":
        if (!follow) { return; }
        streaming.hidden = false;
        var body = streaming.querySelector(".text");
        if (e.start === 0 && e.index === 0) { body.textContent = ""; }
        body.textContent = body.textContent.slice(0, e.start) + e.text;
        return;
      case "turn_ended": streaming.hidden = true; log(turn + "reply " + (e.error || "")); return;
      case "tool_called": log(turn + "tool call " + e.name + " " + e.input); return;
      case "tool_result": log(turn + "tool result " + e.name + (e.is_error ? " (error)" : "")); return;
      case "checkpoint_started": log(turn + "checkpoint started at " + fmt(e.tokens_before) + " tokens"); return;
      case "checkpoint_stored":
        log(turn + "checkpoint stored (" + e.kind + "): " + fmt(e.tokens_before) + " → " + fmt(e.tokens_after));
        var list = document.getElementById("checkpoint-list");
        var n = list.children.length + 1;
        var li = document.createElement("li");
        var a = text("a", n + ". " + e.kind); a.href = base + "/checkpoints/" + n;
        li.appendChild(a); li.appendChild(text("span", " " + fmt(e.tokens_before) + " → " + fmt(e.tokens_after), "dim"));
        list.appendChild(li);
        var none = document.getElementById("no-checkpoint"); if (none) { none.remove(); }
        return;
      case "checkpoint_failed": log(turn + "checkpoint failed: " + e.reason); return;
      case "recall_found":
        var placeholder = recall.querySelector(".empty"); if (placeholder) { placeholder.remove(); }
        recall.appendChild(text("li", turn + e.hits + " hit(s): " + (e.sources || []).join(", ")));
        return;
      case "approval_needed": log(turn + "approval needed: " + e.tool + " " + e.summary); refreshApprovals(); return;
      case "approval_decided": log(turn + "approval " + (e.approved ? "granted" : "denied")); refreshApprovals(); return;
      case "budget_reached": log(turn + "budget reached (" + e.scope + ": " + e.reached + "): the turn waits"); return;
      case "budget_near": log(turn + "budget " + Math.round(e.share * 100) + "% spent (" + e.scope + ": " + e.said + ")"); return;
      case "budget_answered": log(turn + "budget " + (e.raised ? "raised" : "not raised") + " by " + e.by); return;
      case "turn_interrupted": log(turn + "interrupting the turn"); return;
      default: log(turn + e.type + (e.message ? ": " + e.message : e.reason ? ": " + e.reason : ""));
    }
  }
  var source = null;
  function connect() {
    var url = base + "/live?after_seq=" + afterSeq + "&after_event=" + afterEvent + "&record=" + (follow ? "1" : "0");
    source = new EventSource(url);
    source.onopen = function () { state.textContent = "live"; };
    source.addEventListener("record", function (m) { onRecord(JSON.parse(m.data)); });
    source.addEventListener("status", function (m) { onStatus(JSON.parse(m.data)); });
    source.addEventListener("event", function (m) { onEvent(JSON.parse(m.data)); });
    source.addEventListener("stream", function (m) {
      state.textContent = "live (record only: this session has no event stream)";
    });
    source.onerror = function () {  // reconnect from where we are, not from the page's start
      state.textContent = "reconnecting…";
      source.close();
      setTimeout(connect, 1000);
    };
  }
  connect();
})();
