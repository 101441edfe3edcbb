// A parser of server-sent events (the WHATWG event stream format), by hand
// over a fetch body, so that a watch can carry an Authorization header
// (EventSource cannot) and resume with Last-Event-ID.

/** One server-sent event: `id` is the last event id set so far. */
export interface ServerSentEvent {
  id: string;
  event: string;
  data: string;
}

/**
 * readEvents yields the events of an event stream until it ends; an event
 * not ended by a blank line when the stream ends is dropped, as the format
 * says.
 */
export async function* readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerSentEvent, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let id = "";
  let event = "";
  let data: string[] = [];
  let has = false;
  let afterCR = false; // the last chunk ended in \r: a \n first in the next one belongs to it
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        return;
      }
      buf += decoder.decode(value, { stream: true });
      if (afterCR && buf.startsWith("\n")) {
        buf = buf.slice(1);
      }
      afterCR = false;
      for (;;) {
        const m = /\r\n|\r|\n/.exec(buf);
        if (m === null) {
          break;
        }
        if (m[0] === "\r" && m.index === buf.length - 1) {
          afterCR = true; // maybe \r\n split across chunks
        }
        const line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (line === "") {
          if (has) {
            yield { id, event: event || "message", data: data.join("\n") };
          }
          event = "";
          data = [];
          has = false;
          continue;
        }
        if (line.startsWith(":")) {
          continue; // a comment
        }
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) {
          value = value.slice(1);
        }
        switch (field) {
          case "id":
            if (!value.includes("\0")) {
              id = value;
            }
            break;
          case "event":
            event = value;
            break;
          case "data":
            data.push(value);
            has = true;
            break;
        }
      }
    }
  } finally {
    // Done with it (ended, broken, or the caller stopped reading): let the
    // connection go.
    reader.cancel().catch(() => undefined);
  }
}
