package apicore

// UserClient is the client key of a request: a named user's own key
// ("user:NAME") when it acts for one, else its address's (addr, a
// clientKey). The limits on what one client creates and holds (sessions
// created per minute, unused sessions, the store's share, grammar
// samplers) then follow the user, so users behind one address (a NAT, a
// proxy) never share them or evict each other's sessions; open
// connections stay counted per address (limitListener, the socket
// admission) whoever they act for, so both caps apply.
func UserClient(addr, user string) string {
	if user == "" {
		return addr
	}
	return "user:" + user
}
