// The tokenwire chat page: streams /v1/chat/completions over SSE and cancels with Stop.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const keyInput = $("api-key");
  const maxTokens = $("max-tokens");
  keyInput.value = localStorage.getItem("tw-api-key") || "";
  if (params.get("max_tokens")) maxTokens.value = params.get("max_tokens");
  const ignoreEos = params.get("ignore_eos") === "1";
  const history = [];
  let current = null; // {id, bubble}
  let model = null;

  async function modelName() {
    if (!model) {
      const resp = await fetch("/v1/models", { headers: headers() });
      if (!resp.ok) throw new Error("cannot list models: " + resp.status);
      model = (await resp.json()).data[0].id;
    }
    return model;
  }

  const headers = () => {
    const h = { "content-type": "application/json" };
    const key = keyInput.value.trim();
    if (key) h.authorization = "Bearer " + key;
    return h;
  };
  const setStatus = (text) => { $("status").textContent = text; };
  const bubble = (role, text) => {
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.textContent = text;
    $("log").appendChild(div);
    $("log").scrollTop = $("log").scrollHeight;
    return div;
  };

  // Appends to a bubble; the log follows the answer unless the reader scrolled up.
  const append = (out, text) => {
    const log = $("log");
    const following = log.scrollHeight - log.scrollTop - log.clientHeight < 8;
    out.textContent += text;
    if (following) log.scrollTop = log.scrollHeight;
  };

  async function ask(prompt) {
    localStorage.setItem("tw-api-key", keyInput.value.trim());
    history.push({ role: "user", content: prompt });
    bubble("user", prompt);
    const out = bubble("assistant", "");
    $("send").disabled = true;
    setStatus("waiting");
    let finish = null;
    try {
      const body = {
        model: await modelName(),
        messages: history,
        stream: true,
        max_tokens: Number(maxTokens.value) || 256,
        temperature: 0.8,
        ignore_eos: ignoreEos,
      };
      const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
      if (!resp.ok) {
        const err = await resp.json().catch(() => ({}));
        throw new Error((err.error && err.error.message) || resp.statusText);
      }
      current = { id: resp.headers.get("x-request-id"), bubble: out };
      $("stop").disabled = false;
      setStatus("streaming");
      finish = await readStream(resp.body, out);
    } catch (e) {
      setStatus("error: " + e.message);
    } finally {
      current = null;
      $("stop").disabled = true;
      $("send").disabled = false;
    }
    if (finish) {
      history.push({ role: "assistant", content: out.textContent });
      if (finish === "cancelled") out.classList.add("stopped");
      setStatus(finish === "cancelled" ? "stopped" : "done (" + finish + ")");
    }
  }

  // Reads SSE frames, appending each delta; returns the finish reason.
  async function readStream(body, out) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let finish = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return finish;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const frame = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return finish;
          const chunk = JSON.parse(data);
          // A cancelled stream ends with an error of its own (Stop): not a failure.
          if (chunk.error && chunk.error.code === "request_cancelled") { finish = "cancelled"; continue; }
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.delta && choice.delta.content) append(out, choice.delta.content);
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    }
  }

  $("ask").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt || current) return;
    $("prompt").value = "";
    ask(prompt);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("ask").requestSubmit(); }
  });
  $("stop").addEventListener("click", async () => {
    if (!current || !current.id) return;
    $("stop").disabled = true;
    setStatus("stopping");
    // The stream stays open: it ends with the error request_cancelled.
    await fetch("/v1/requests/" + encodeURIComponent(current.id) + "/cancel", { method: "POST", headers: headers() });
  });
})();
