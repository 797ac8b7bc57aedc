package pserver

import (
	"context"
	"encoding/json"
	"sync"
	"time"
)

// hub fans dashboard updates out to SSE clients. Each client has a bounded
// queue; an update that does not fit is dropped for that client and counted,
// so a slow client never slows the broadcaster, let alone the sync path.
type hub struct {
	mu      sync.Mutex
	clients map[*sseClient]struct{}
	buf     int
	m       *metrics
	closed  bool
}

type sseClient struct {
	ch      chan []byte
	dropped uint64
}

func newHub(buf int, m *metrics) *hub {
	return &hub{clients: map[*sseClient]struct{}{}, buf: buf, m: m}
}

// add registers a client; it returns nil after close.
func (h *hub) add() *sseClient {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	c := &sseClient{ch: make(chan []byte, h.buf)}
	h.clients[c] = struct{}{}
	h.m.sseClients.Set(float64(len(h.clients)))
	return c
}

func (h *hub) remove(c *sseClient) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.clients[c]; ok {
		delete(h.clients, c)
		close(c.ch)
	}
	h.m.sseClients.Set(float64(len(h.clients)))
}

func (h *hub) broadcast(data []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.clients {
		select {
		case c.ch <- data:
		default:
			c.dropped++
			h.m.sseDropped.Inc()
		}
	}
	h.m.sseUpdates.Inc()
}

func (h *hub) clientCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clients)
}

// close disconnects every client.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for c := range h.clients {
		delete(h.clients, c)
		close(c.ch)
	}
	h.m.sseClients.Set(0)
}

// updateLoop builds one dashboard update whenever step summaries arrived, at
// most once per UpdateEvery, and broadcasts it.
func (s *Server) updateLoop() {
	defer s.wg.Done()
	var last time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-s.changed:
		}
		if wait := s.cfg.UpdateEvery - time.Since(last); wait > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		if s.hub.clientCount() == 0 {
			continue
		}
		data, err := json.Marshal(s.update(context.Background()))
		if err != nil {
			continue
		}
		s.hub.broadcast(data)
	}
}

// Update is what the SSE stream pushes: the latest steps' heat-map columns and
// series points, the totals and the top lists.
type Update struct {
	Summary  Summary       `json:"summary"`
	Heat     HeatMap       `json:"heat"`
	Steps    []StepPoint   `json:"steps"`
	TopRanks []RankRow     `json:"top_ranks"`
	TopFuncs []FuncAnomRow `json:"top_functions"`
}

// updateSteps is how many recent steps an update carries, so a client that
// missed a few updates still has every column.
const updateSteps = 8

func (s *Server) update(context.Context) Update {
	var u Update
	s.View(func(st *State) {
		u.Summary = s.summary(st)
		u.Heat = heatMap(st, updateSteps)
		u.Steps = stepSeries(st, updateSteps)
		u.TopRanks = topRanks(st, 10, "count")
		u.TopFuncs = topFuncs(st, 10, "count")
	})
	return u
}
