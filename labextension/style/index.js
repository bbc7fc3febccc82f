import './base.css';
import './session.css';
